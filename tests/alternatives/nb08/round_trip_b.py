# Moves `dim` to the end, uses aminmax and rounds half up (floor(v + 0.5)), all in x's own dtype; moves it back.
import torch


def round_trip(x, bits, dim):
    y = x.movedim(dim, -1)
    mn, mx = torch.aminmax(y, dim=-1, keepdim=True)
    span = mx - mn
    step = span / (2**bits - 1)
    step[span == 0] = 1
    q = torch.floor((y - mn) / step + 0.5).clamp_(0, 2**bits - 1)
    return (q * step + mn).movedim(-1, dim)
