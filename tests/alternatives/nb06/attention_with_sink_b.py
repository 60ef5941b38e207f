# einsum for the scores and the output; the future hidden with torch.tril.
import torch


def _weights(s, sink_logit):
    """softmax with an empty slot of logit sink_logit [H] (exercise 3, written again here)."""
    sink = sink_logit[:, None, None].expand(s.shape[0], s.shape[1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def attention_with_sink(q, k, v, sink_logit):
    t, d = q.shape[1], q.shape[2]
    s = torch.einsum("htd,hsd->hts", q, k) * d**-0.5
    visible = torch.tril(torch.ones(t, t, dtype=torch.bool))
    w = _weights(s.masked_fill(~visible, -torch.inf), sink_logit)
    return torch.einsum("hts,hsd->htd", w, v)
