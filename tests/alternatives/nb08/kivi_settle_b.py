# Python loops over batch rows, KV heads and groups; picks the group's slot indices with nonzero and writes the
# rounded numbers in place into the copies it was given (float64 intermediates).
import torch


def _round_dim(x, bits, dim):
    lo = x.min(dim=dim, keepdim=True).values
    hi = x.max(dim=dim, keepdim=True).values
    step = (hi - lo) / (2**bits - 1)
    step[hi == lo] = 1.0
    return torch.clamp(torch.round((x - lo) / step), 0, 2**bits - 1) * step + lo


def kivi_settle(keys, values, positions, done, next_position, bits, group, residual):
    B, H, S, d = keys.shape
    start = int(done)
    while start + group <= next_position - residual:
        for b in range(B):
            for h in range(H):
                pos = positions[b, h]
                idx = ((pos >= start) & (pos <= start + group - 1)).nonzero().flatten()
                if idx.numel() == 0:
                    continue
                k = keys[b, h, idx].double()                       # [n, d]: per channel over the group's tokens
                keys[b, h, idx] = _round_dim(k, bits, 0).to(keys.dtype)
                v = values[b, h, idx].double().reshape(len(idx), d // group, group)
                values[b, h, idx] = _round_dim(v, bits, -1).reshape(len(idx), d).to(values.dtype)
        start += group
    return keys, values, start
