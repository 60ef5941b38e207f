# A new [B, T + 1] tensor: column 0 the sink, the rest the samples.
import torch


def prepend_sink(x, sink_id):
    out = torch.empty(x.shape[0], x.shape[1] + 1, dtype=x.dtype, device=x.device)
    out[:, 0] = sink_id
    out[:, 1:] = x
    return out
