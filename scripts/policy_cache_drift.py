"""How far PolicyCache's re-rotated keys drift from exact, per dtype and stream length (issue 36).

    python scripts/policy_cache_drift.py [--steps 5000] [--long 20000]

A tiny random transformers Llama (one layer; head sizes 64 as SmolLM2's and 128 as Llama-2's, with their RoPE
bases) streams random tokens one at a time through a ``PolicyCache`` (StreamingLLM 4+28 and H2O 16+16 with 2
sinks, both with positions inside the cache). Every key is recorded as it arrives (rotated by transformers at its
stream position, in the model's dtype). At checkpoints each cached key is compared with the exact rotation of
that arrived key by its current offset, computed in float64: under the cache rule a key at rank r, after n
tokens in S slots, must be rotated at r + (n - 1) - (S - 1), i.e. ``r + n - S - p`` beyond its position p.

Printed per run: the largest relative error ``|cached - exact| / |exact|`` over the sinks and over the other
keys, and the sink keys' norms over their norms on arrival (min-max). Uses only PolicyCache's public interface,
so the same script measures any version of it.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from course.models.llama import rope
from course.policies import make_policy
from course.transformers_cache import PolicyCache

HEADS = {"SmolLM2 (d=64, theta 1e5)": (64, 100000.0), "Llama-2 (d=128, theta 1e4)": (128, 10000.0)}
POLICIES = {"streaming 4+28": ("sdpa", dict(name="streaming", sinks=4)),
            "h2o 16+16, 2 sinks": ("eager", dict(name="h2o", sinks=2, positions="cache"))}
BUDGET = 32


def tiny_llama(head_dim: int, theta: float, dtype: torch.dtype, impl: str):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=101, hidden_size=2 * head_dim, intermediate_size=4 * head_dim, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=1 << 20,
                      rope_parameters={"rope_type": "default", "rope_theta": theta}, attn_implementation=impl)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def run(head: str, policy_name: str, dtype: torch.dtype, checkpoints: list[int]) -> list[dict]:
    head_dim, theta = HEADS[head]
    impl, kw = POLICIES[policy_name]
    kw = dict(kw)
    hf = tiny_llama(head_dim, theta, dtype, impl)
    policy = make_policy(kw.pop("name"), BUDGET, **kw)
    n_sink = kw.get("sinks", 0)
    cache = PolicyCache(hf, policy)
    arrived: dict[int, torch.Tensor] = {}  # stream position -> key as it arrived, layer 0 [H_kv, d]
    layer = cache.layers[0]
    update = layer.update

    def recording_update(key_states, value_states, *args, **kwargs):
        for i in range(key_states.shape[2]):
            arrived[cache.seen + i] = key_states[0, :, i].detach().clone()
        return update(key_states, value_states, *args, **kwargs)

    layer.update = recording_update
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 101, (1, checkpoints[-1] + 8), generator=g)
    rows = []
    with torch.no_grad():
        hf(ids[:, :8], cache=cache, use_cache=True)
        for t in range(8, ids.shape[1]):
            hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            n = cache.seen
            if n not in checkpoints:
                continue
            keys = layer.keys[0].double()  # [H_kv, S, d] the keys layer 0 attended with
            pos = cache.positions(0)[0]  # [H_kv, S]
            s = pos.shape[-1]
            ranks = pos.argsort(-1).argsort(-1)
            offset = ranks + (n - s) - pos
            orig = torch.stack([torch.stack([arrived[int(p)][h] for p in pos[h]]) for h in range(pos.shape[0])])
            exact = rope(orig.double()[None], offset[None].long(), theta)[0]
            err = (keys - exact).norm(dim=-1) / exact.norm(dim=-1)
            norm = keys.norm(dim=-1) / orig.double().norm(dim=-1)
            sink = pos < n_sink
            rows.append({"tokens": n, "err_sink": float(err[sink].max()) if sink.any() else float("nan"),
                         "err_rest": float(err[~sink].max()),
                         "norm": (float(norm[sink].min()), float(norm[sink].max())) if sink.any() else None})
    cache.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--long", type=int, default=20000, help="also: float16, Llama-2's head, StreamingLLM this far")
    args = p.parse_args()
    checkpoints = [c for c in (1000, 2000, args.steps) if c <= args.steps]
    start = time.time()
    print(f"{'head':28s} {'policy':20s} {'dtype':9s} {'tokens':>6s} {'sink rel. err':>13s} {'other rel. err':>14s} "
          f"{'sink norm / on arrival':>22s}")
    cases = [(h, pol, dt, checkpoints) for h in HEADS for pol in POLICIES
             for dt in (torch.float32, torch.bfloat16, torch.float16)]
    if args.long:
        cases.append(("Llama-2 (d=128, theta 1e4)", "streaming 4+28", torch.float16, sorted({*checkpoints, args.long})))
    for head, pol, dt, cps in cases:
        for r in run(head, pol, dt, cps):
            norm = "" if r["norm"] is None else f"{r['norm'][0]:.4f}-{r['norm'][1]:.4f}"
            print(f"{head:28s} {pol:20s} {str(dt).removeprefix('torch.'):9s} {r['tokens']:6d} {r['err_sink']:13.2e} "
                  f"{r['err_rest']:14.2e} {norm:>22s}", flush=True)
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
