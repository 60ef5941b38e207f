"""Small deterministic inputs the checkers share, and the exam they are drawn for.

Every seed a checker uses goes through ``drawn``: as written while a student practises, moved by the exam's offset
while a graded release is graded (``exam(seed)``, the seed kept in the grading key). So the tiny models, token ids
and tensors a checker feeds a function differ from one graded release to the next, and answers computed for the
public inputs (a table of outputs) do not transfer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from course.compression import compress_prompt
from course.models import build_model
from course.models.base import CausalLM, ModelConfig
from course.policies import Policy
from course.streaming import next_token_nll


_EXAM = {"offset": 0}


def drawn(seed: int) -> int:
    """A checker's ``seed`` for the exam being graded (itself outside one)."""
    return seed + _EXAM["offset"]


def generator(seed: int) -> torch.Generator:
    """A random generator for a checker's ``seed`` in the exam being graded."""
    return torch.Generator().manual_seed(drawn(seed))


@contextmanager
def exam(seed: int | None) -> Iterator[None]:
    """Inside, every checker draws its inputs for the graded release of ``seed`` (None: the public inputs)."""
    previous = _EXAM["offset"]
    _EXAM["offset"] = 0 if seed is None else 1 + seed % 1_000_003
    try:
        yield
    finally:
        _EXAM["offset"] = previous


def tiny_model(family: str = "llama", seed: int = 0, n_layer: int = 2, sink_logit: str = "none",
               kv_heads: int | None = None, output_gate: str = "none") -> CausalLM:
    """A small random model in float64 (fast, and exact enough to compare to 1e-9): 4 query heads, 2 KV heads for
    a Llama (GQA) unless ``kv_heads`` says otherwise; ``sink_logit`` and ``output_gate``: see ``ModelConfig``
    ("learned" gives every attention layer a per-head logit of an empty slot, here at 0; "elementwise" a gate on
    its output)."""
    kv = (2 if family == "llama" else 4) if kv_heads is None else kv_heads
    cfg = ModelConfig(family=family, vocab_size=53, n_layer=n_layer, n_head=4, n_kv_head=kv,
                      d_model=32, head_dim=8, d_ff=48, max_positions=512, name=f"tiny-{family}",
                      sink_logit=sink_logit, output_gate=output_gate)
    torch.manual_seed(drawn(seed))
    model = build_model(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def close(a, b, tol: float = 1e-6) -> bool:
    """Same shape and values within ``tol`` (never raises)."""
    try:
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=tol, rtol=tol))
    except (TypeError, RuntimeError, ValueError):
        return False


def token_ids(n: int, vocab: int = 53, seed: int = 0) -> torch.Tensor:
    """[1, n] random token ids."""
    return torch.randint(0, vocab, (1, n), generator=generator(seed))


def _kept(cache) -> torch.Tensor:
    """Sorted cached positions of every layer and KV head (batch row 0): [L, H_kv, S]."""
    return torch.stack([layer.live()[2][0].sort(dim=-1).values for layer in cache.layers])


@torch.inference_mode()
def policy_trace(model: CausalLM, ids: torch.Tensor, policy: Policy,
                 prompt: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run ``policy`` in the real cache: the first ``prompt`` tokens of ``ids`` [1, T] as one prompt,
    compressed (``course.compression.compress_prompt``), then one token at a time (the decode loop).

    Returns the kept positions ([L, H_kv, S], sorted) after the compression (if any) and after every
    decoding step, and the NLL of every token predicted by a decoding step [T - max(prompt, 1)]."""
    if prompt:
        cache, _ = compress_prompt(model, ids[:, :prompt], policy)
        kept = [_kept(cache)]
    else:
        cache, kept = model.new_cache(1, policy), []
    nll = []
    for t in range(prompt, ids.shape[1] - 1):
        logits = model(ids[:, t : t + 1], cache=cache).logits
        nll.append(next_token_nll(logits, ids[:, t + 1 : t + 2])[0, 0])
        kept.append(_kept(cache))
    return kept, torch.stack(nll)


def first_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> int | None:
    """Index of the first step whose kept positions differ, or None."""
    return next((i for i, (g, w) in enumerate(zip(got, want)) if not torch.equal(g, w)), None)
