# logsumexp over the real scores and the sink logit together, then exp(s - lse).
import torch


def softmax_with_sink(scores, sink_logit):
    sink = sink_logit[:, None, None].expand(scores.shape[0], scores.shape[1], 1)
    lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1, keepdim=True)
    return torch.exp(scores - lse)
