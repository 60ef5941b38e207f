"""``python -m course bench --quantized-peer``: the course's quantized store beside transformers' ``QuantizedCache``.

An independent peer for the quantized cache, as kvpress is for eviction: the same weights (SmolLM2-135M) and the same
passages, decoded one token at a time, each passage's perplexity over its tokens after the first ``start``:

* transformers with its plain ``DynamicCache`` and with ``QuantizedCache`` (quanto backend; 4 and 2 bits, groups of
  ``group``, a residual of ``residual`` tokens);
* the course's model with its ``KVCache`` in full precision and with ``KIVI`` (same bits, group and residual), keys
  per channel (KIVI's layout) and per token (the layout of transformers' cache).

Three named differences separate the peer from KIVI: it groups the keys per token (quanto's axis 0: groups of
channels within one token, the values alike); it quantizes keys after the rotary embedding (the course before it);
and when its residual is full it quantizes the whole cache again from the dequantized numbers (so early tokens are
rounded again, with other groups), where KIVI quantizes each group once. The table shows how much of the gap the
first difference explains: the course's ``keys="token"`` row against the peer's.
"""

from __future__ import annotations

import math
import statistics
import shlex
from pathlib import Path

import torch
from torch import Tensor

from course.data import load_text, tokenize
from course.instructor.bench import machine
from course.instructor.grading.throughput import write_report
from course.models import from_transformers, load_hf_model
from course.policies import make_policy
from course.quantize import KIVI
from course.streaming import decode_stream

__all__ = ["quantized_peer", "quantized_peer_table", "write_quantized_peer_report"]

BEGIN, END = "<!-- quantized-peer:begin -->", "<!-- quantized-peer:end -->"
BOOKS = ("pride_and_prejudice", "emma", "persuasion", "sense_and_sensibility")


def _passages(tok, tokens: int, device: str) -> Tensor:
    """One passage of ``tokens`` tokens from the start of each book in BOOKS: [len(BOOKS), tokens]."""
    return torch.cat([tokenize(tok, load_text("austen", book), tokens, device)[:, :tokens] for book in BOOKS])


def _perplexities(nll: Tensor, start: int) -> list[float]:
    """Perplexity of each row of per-token NLLs [B, T] over tokens start..T-1."""
    return [math.exp(float(row[start:].mean())) for row in nll]


@torch.inference_mode()
def _transformers_nll(hf, ids: Tensor, cache) -> Tensor:
    """Per-token NLL [B, T-1] of transformers decoding ``ids`` one token at a time into ``cache``."""
    out = []
    for t in range(ids.shape[1] - 1):
        logits = hf(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1].float()
        out.append(-logits.log_softmax(-1).gather(-1, ids[:, t + 1, None])[:, 0])
    return torch.stack(out, 1)


def quantized_peer(model_name: str = "smollm2-135m", device: str = "cpu", tokens: int = 320, start: int = 64,
                   bits: tuple[int, ...] = (4, 2), group: int = 32, residual: int = 32) -> dict:
    """Each decoder's perplexity per passage: {"rows": [(label, [ppl per passage]), ...], settings...}."""
    from transformers import DynamicCache, QuantizedCache

    hf, tok = load_hf_model(model_name, attn="sdpa")
    hf = hf.to(device).float().eval()
    model = from_transformers(hf, model_name)
    ids = _passages(tok, tokens, device)
    rows = [("transformers, DynamicCache", _perplexities(_transformers_nll(hf, ids, DynamicCache(config=hf.config)),
                                                         start))]
    for b in bits:
        cache = QuantizedCache(backend="quanto", config=hf.config, nbits=b, q_group_size=group,
                               residual_length=residual)
        rows.append((f"transformers, QuantizedCache (quanto) {b}-bit", _perplexities(_transformers_nll(hf, ids, cache),
                                                                                      start)))
    course = decode_stream(model, ids, make_policy("full"), progress=False).nll
    rows.append(("course, KVCache full precision", _perplexities(course, start)))
    for b in bits:
        for keys in ("channel", "token"):
            kivi = KIVI(bits=b, group=group, residual=residual, keys=keys)
            nll = decode_stream(model, ids, make_policy("full", quantizer=kivi), progress=False).nll
            rows.append((f"course, KIVI {b}-bit, keys per {keys}", _perplexities(nll, start)))
    return {"model": model.config.name, "device": device, "tokens": tokens, "start": start, "group": group,
            "residual": residual, "passages": len(BOOKS), "machine": machine(), "rows": rows}


def quantized_peer_table(r: dict, command: str) -> str:
    """The result as markdown (the block between the markers)."""
    lines = [
        f"Measured by `{command}`: model {r['model']} on {r['device']}, torch {r['machine']['torch']}; "
        f"{r['passages']} passages (the first {r['tokens']} tokens of {', '.join(BOOKS)}), decoded one token at a "
        f"time, perplexity over tokens {r['start']}..{r['tokens'] - 1}; groups of {r['group']}, residual "
        f"{r['residual']} tokens.",
        "",
        "| decoder | median perplexity | per passage |",
        "|---|---|---|",
    ]
    for label, ppl in r["rows"]:
        lines.append(f"| {label} | {statistics.median(ppl):.2f} | {', '.join(f'{p:.2f}' for p in ppl)} |")
    return "\n".join(lines)


def write_quantized_peer_report(result: dict, path: Path, command: str | None = None) -> Path:
    """Write the table between the markers in ``path`` (docs/benchmarks.md)."""
    command = command or shlex.join(["python", "-m", "course", "bench", "--quantized-peer"])
    return write_report(path, quantized_peer_table(result, command), BEGIN, END)
