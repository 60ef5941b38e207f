# A loop over the channel groups (slices of `group` channels), each rounded per token in float64, glued back with cat.
import torch


def round_values(v, bits, group):
    pieces = []
    top = 2**bits - 1
    for start in range(0, v.shape[-1], group):
        chunk = v[..., start : start + group].to(torch.float64)
        mn = chunk.min(dim=-1, keepdim=True).values
        mx = chunk.max(dim=-1, keepdim=True).values
        scale = (mx - mn) / top
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        code = torch.clamp(torch.round((chunk - mn) / scale), 0, top)
        pieces.append(code * scale + mn)
    return torch.cat(pieces, dim=-1).to(v.dtype)
