"""Generating text through a compressed cache: token by token, with any policy.

    steps = generate(model, tokenizer, "It is a truth universally acknowledged",
                     make_policy("streaming", 64, model=model), max_new_tokens=200)
    for step in steps: print(step.text, end="")

A prompt (or a chat turn) runs with full causal attention and is then compressed to the policy's
budget (``course.compression.compress_prompt``, the same protocol as every evaluation in the course);
each new token is decoded through the cache, which keeps evicting as its policy says. Decoding is
greedy (``temperature=0``) or sampled with a temperature and nucleus (top-p) cut-off from a seeded
generator, so that a seed gives the same text on every run. ``Chat`` keeps one cache across turns
and feeds each turn through the model's chat template (SmolLM2-Instruct has one).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from course.compression import compress_prompt
from course.kvcache import KVCache
from course.models.base import CausalLM
from course.policies import Policy

__all__ = ["Step", "Sampler", "generate", "sample_batch", "Chat", "Turn", "fluency"]


@dataclass(frozen=True)
class Step:
    """One generated token: its id, its text, and the cache right after it was decoded."""

    token: int
    text: str
    cache_slots: int
    cache_bytes: int


@dataclass
class Sampler:
    """Greedy (``temperature == 0``) or sampled decoding; ``seed`` makes sampling repeatable."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be between 0 (greedy) and 10, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer between 0 and 2**63 - 1, got {self.seed!r}")
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: Tensor) -> int:
        """The next token from one position's logits [V] (sampled on the CPU, so a seed means the same
        text on any device)."""
        logits = logits.detach().float().cpu()
        if self.temperature == 0.0:
            return int(logits.argmax())
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1.0:  # nucleus: the smallest set of tokens whose probability reaches top_p
            sorted_p, order = self._top_mass(probs)
            outside = sorted_p.cumsum(0) - sorted_p >= self.top_p
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self.generator))


    def _top_mass(self, probs: Tensor, k: int = 256) -> tuple[Tensor, Tensor]:
        """The most probable tokens, in descending order, until their mass reaches top_p: (probs [k'],
        ids [k']). Sorting the whole vocabulary gives the same nucleus, several times slower: the nucleus is
        usually a few dozen tokens, and a token past these k' has at least top_p of mass before it."""
        while True:
            k = min(k, probs.numel())
            top, order = probs.topk(k)
            if k == probs.numel() or top.cumsum(0)[-1] >= self.top_p:
                return top, order
            k *= 4


def _check_steps(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


@torch.inference_mode()
def _decode(model: CausalLM, tokenizer, cache: KVCache, logits: Tensor, max_new_tokens: int, sampler: Sampler,
            stop: Sequence[str], stop_ids: set[int]) -> Iterator[Step]:
    """Decode from the last logits [V] through ``cache``; stop at a stop id (not fed, not yielded), a
    stop string (yielded, then stop) or ``max_new_tokens``."""
    ids: list[int] = []
    text = ""
    for _ in range(max_new_tokens):
        token = sampler(logits)
        if token in stop_ids:
            return
        ids.append(token)
        new_text = tokenizer.decode(ids)
        piece, text = new_text[len(text):], new_text
        logits = model(torch.tensor([[token]], device=model.device), cache=cache).logits[0, -1]
        yield Step(token, piece, cache.n_slots, cache.nbytes)
        if any(s and s in text for s in stop):
            return


def generate(model: CausalLM, tokenizer, prompt: str | Tensor, policy: Policy | None = None, *,
             max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             stop: Sequence[str] = (), ignore_eos: bool = False) -> Iterator[Step]:
    """Generate up to ``max_new_tokens`` after ``prompt`` (text, or ids [1, P]) through a cache managed by
    ``policy`` (default: keep everything); yields one ``Step`` per token as soon as it is decoded. Stops at
    the tokenizer's end-of-sequence token (unless ``ignore_eos``: long generations for measurements) or after
    a stop string. Bad values are refused before any work."""
    _check_steps(max_new_tokens)
    sampler = Sampler(temperature, top_p, seed)
    ids = tokenizer(prompt, return_tensors="pt").input_ids if isinstance(prompt, str) else prompt
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"prompt must be text or ids of shape [1, P] with P >= 1, got {tuple(ids.shape)}")
    model.config.check_tokens(ids.shape[1] + max_new_tokens, "the prompt + max_new_tokens")
    cache, logits = compress_prompt(model, ids, policy, logits_to_keep=1)
    stop_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None and not ignore_eos else set()
    return _decode(model, tokenizer, cache, logits[0, -1], max_new_tokens, sampler, stop, stop_ids)


@torch.inference_mode()
def sample_batch(model: CausalLM, prompts: Tensor, policy: Policy | None = None, *, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> tuple[Tensor, KVCache]:
    """Continue every prompt of a batch at once through one cache managed by ``policy`` (measurements: no
    stop token, every row generates ``max_new_tokens``). prompts: [B, P] ids, all of one length; row b
    samples with its own seeded ``Sampler`` (seed + b). One decode step serves the whole batch, which on
    a CPU costs about what one row costs. Returns the new ids [B, N] and the cache after the last token."""
    _check_steps(max_new_tokens)
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be ids of shape [B, P] with P >= 1, got {tuple(prompts.shape)}")
    samplers = [Sampler(temperature, top_p, seed + b) for b in range(prompts.shape[0])]
    model.config.check_tokens(prompts.shape[1] + max_new_tokens, "the prompts + max_new_tokens")
    cache, logits = compress_prompt(model, prompts, policy, logits_to_keep=1)
    logits = logits[:, -1]
    new = []
    for step in range(max_new_tokens):
        tokens = torch.tensor([sample(row) for sample, row in zip(samplers, logits)], device=model.device)
        new.append(tokens)
        if step < max_new_tokens - 1:
            logits = model(tokens[:, None], cache=cache).logits[:, -1]
    return torch.stack(new, 1).cpu(), cache


@dataclass
class Turn:
    """One exchange of a chat and what it cost."""

    user: str
    assistant: str
    new_tokens: int
    cache_slots: int
    cache_bytes: int
    seconds: float


class Chat:
    """A conversation through one cache that persists across turns, managed by ``policy``.

    Each turn's new text (the chat template's rendering of the user message and the assistant prompt)
    runs with full attention over what the cache holds, is compressed to the budget, and the answer is
    decoded token by token, until the end-of-sequence token (which ends the turn) or ``max_new_tokens``.
    Models without a chat template get plain "User:" / "Assistant:" lines."""

    def __init__(self, model: CausalLM, tokenizer, policy: Policy | None = None, *, system: str | None = None,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> None:
        _check_steps(max_new_tokens)
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.sampler = Sampler(temperature, top_p, seed)
        self.max_new_tokens = max_new_tokens
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.fed = ""  # the conversation text the cache has read
        self.cache: KVCache | None = None
        self.turns: list[Turn] = []

    def _render(self) -> str:
        """The whole conversation as the model reads it, ending where the assistant's answer begins."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
        # plain lines; an answer follows "Assistant:" exactly as generated, so earlier turns never change
        return "".join(f"Assistant:{m['content']}\n" if m["role"] == "assistant" else
                       f"{m['role'].capitalize()}: {m['content']}\n" for m in self.messages) + "Assistant:"

    def say(self, text: str) -> Iterator[Step]:
        """Send a user message; yields the answer's steps (the turn is recorded when they are consumed)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("a chat message must be non-empty text")
        self.messages.append({"role": "user", "content": text})
        rendered = self._render()
        if not rendered.startswith(self.fed):
            raise RuntimeError("the chat template rewrote earlier turns; this chat cannot continue on one cache")
        new_ids = self.tokenizer(rendered[len(self.fed):], add_special_tokens=False, return_tensors="pt").input_ids
        self.model.config.check_tokens(self.seen + new_ids.shape[1] + self.max_new_tokens, "this chat")
        start = time.perf_counter()
        self.cache, logits = compress_prompt(self.model, new_ids, self.policy, self.cache, logits_to_keep=1)
        self.fed = rendered
        stop_ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        answer: list[Step] = []
        for step in _decode(self.model, self.tokenizer, self.cache, logits[0, -1], self.max_new_tokens, self.sampler,
                            (), stop_ids):
            answer.append(step)
            yield step
        reply = self.tokenizer.decode([s.token for s in answer])
        self.messages.append({"role": "assistant", "content": reply})
        self.fed += reply  # what the cache has read; the template's end-of-turn marker comes with the next turn
        self.turns.append(Turn(text, reply, len(answer), self.cache.n_slots, self.cache.nbytes,
                               time.perf_counter() - start))

    @property
    def seen(self) -> int:
        """Tokens the conversation has fed through the cache so far."""
        return 0 if self.cache is None else self.cache.seen


@torch.inference_mode()
def fluency(model: CausalLM, prompt: Tensor, new_tokens: Sequence[int], n: int = 4) -> dict[str, float]:
    """Two signals of how fluent generated text is, whatever cache produced it.

    * ``ppl_full_context``: perplexity of the new tokens under one plain forward over prompt + new tokens
      (the model judging the text with its full context; degenerate text scores high, or absurdly low when
      it only repeats itself);
    * ``distinct``: share of distinct ``n``-grams among the new tokens (1.0: no repetition; a loop drives it to 0).
    prompt: [1, P] ids; new_tokens: the generated ids."""
    from course.streaming import next_token_nll

    if len(new_tokens) < n + 1:
        raise ValueError(f"need at least {n + 1} new tokens to measure fluency, got {len(new_tokens)}")
    ids = torch.cat([prompt.cpu(), torch.tensor([list(new_tokens)])], dim=1).to(model.device)
    model.config.check_tokens(ids.shape[1], "fluency")
    p = prompt.shape[1]
    nll = next_token_nll(model(ids[:, :-1]).logits[:, p - 1 :], ids[:, p:])
    grams = [tuple(new_tokens[i : i + n]) for i in range(len(new_tokens) - n + 1)]
    return {"ppl_full_context": float(nll.double().mean().exp()), "distinct": len(set(grams)) / len(grams)}
