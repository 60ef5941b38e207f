# Vectorised over batch rows and KV heads: a boolean mask per group, masked min/max (filled with +-inf), and
# torch.where to change only the group's slots; computed in float32.
import torch


def _round(x, lo, hi, bits):
    s = torch.where(hi > lo, (hi - lo) / (2**bits - 1), torch.ones_like(lo))
    return ((x - lo) / s).round().clamp(0, 2**bits - 1) * s + lo


def kivi_settle(keys, values, positions, done, next_position, bits, group, residual):
    while done + group <= next_position - residual:
        in_group = (positions >= done) & (positions < done + group)          # [B, H_kv, S]
        sel = in_group[..., None]                                            # [B, H_kv, S, 1]
        k = keys.float()
        k_lo = k.masked_fill(~sel, float("inf")).amin(dim=2, keepdim=True)    # [B, H_kv, 1, d]
        k_hi = k.masked_fill(~sel, float("-inf")).amax(dim=2, keepdim=True)
        k_new = _round(k, k_lo, k_hi, bits)
        keys = torch.where(sel, k_new.to(keys.dtype), keys)
        b, h, s, d = values.shape
        v = values.float().reshape(b, h, s, d // group, group)
        v_new = _round(v, v.amin(-1, keepdim=True), v.amax(-1, keepdim=True), bits).reshape(b, h, s, d)
        values = torch.where(sel, v_new.to(values.dtype), values)
        done += group
    return keys, values, done
