# The formula written out: exponentials with the row's largest logit subtracted, the sink in the denominator.
import torch


def softmax_with_sink(scores, sink_logit):
    b = sink_logit.view(-1, 1, 1)
    top = torch.maximum(scores.amax(dim=-1, keepdim=True), b)
    e = torch.exp(scores - top)
    return e / (e.sum(dim=-1, keepdim=True) + torch.exp(b - top))
