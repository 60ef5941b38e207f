"""The course's policies inside transformers: a ``Cache`` for ``model.generate()``.

    from course.policies import make_policy
    from course.transformers_cache import PolicyCache, course_config

    policy = make_policy("streaming", 256, model=course_config(hf_model))
    cache = PolicyCache(hf_model, policy)
    out = hf_model.generate(ids, cache=cache, max_new_tokens=2000, do_sample=False)  # or past_key_values=cache

The cache keeps its slots in the course's own ``KVCache`` (``course.kvcache``), managed by the policy, so
eviction, prompt compression (SnapKV), accumulated attention (H2O) and pinned sinks are the course's code,
not a second copy of it. What this module adds is the glue to transformers 5:

* **Positions.** transformers rotates queries and keys (RoPE) before the cache sees the keys, at the positions
  ``generate`` passes: the true positions of the stream. Under the *original* rule that is what the policy wants,
  and cached keys are never touched again. Under the *cache* rule (StreamingLLM) every key must sit at its slot's
  rank and the query at its own slot; RoPE scores depend only on the distance between query and key, so the cache
  keeps each key rotated at ``k_rank + (q_pos - q_rank)``: the true distance in the rotation becomes the in-cache
  distance. A key is re-rotated only when that position changes (for StreamingLLM: the sinks, once per step;
  the window keys never move), and the rotation it already has is tracked per slot (``rope_offset``).
* **Lengths.** ``get_seq_length()`` is the number of tokens the stream has had (``generate`` slices its inputs
  and GPT-2 takes its learned positions from it); ``get_mask_sizes()`` is the number of slots attended to.
* **Attention weights** (H2O, SnapKV) come from a forward hook on each attention module; only
  ``attn_implementation="eager"`` returns them, so those policies refuse the others before any work.
* **Compression** after a prompt and the stream counter are driven by hooks on the base model.

Supported: the GPT-2 family (original positions only: its positions are learned and added at the input) and
the Llama family as the course loads it (Llama, Mistral and Qwen2 without sliding-window layers or RoPE
scaling). Refused, by name: padded batches (left padding), a multi-token forward on a cache that already
holds tokens (chunked prefill, continuing a prompt), beam search and other cache reordering.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from course.kvcache import KVCache
from course.models import config_from_hf
from course.models.base import ModelConfig
from course.models.llama import rope
from course.policies import Policy

__all__ = ["PolicyCache", "PolicyLayer", "UnsupportedCombination", "course_config", "needs_attention_weights"]

WEIGHTS_IMPLEMENTATION = "eager"  # the only attention implementation of transformers that returns weights
OFFSET = "rope_offset"  # per-slot statistic: how far (in positions) a stored key is rotated beyond its original position


class UnsupportedCombination(ValueError):
    """A policy, model, attention implementation or input that this cache cannot run exactly (refused before
    any work, with the reason)."""


def course_config(hf_model) -> ModelConfig:
    """The course's ``ModelConfig`` of a transformers model (its family's rules; refuses what the course cannot
    run, e.g. RoPE scaling or sliding-window layers). Pass it as ``make_policy(..., model=course_config(m))``."""
    return config_from_hf(hf_model.config, getattr(hf_model.config, "_name_or_path", "") or "model")


def needs_attention_weights(policy: Policy) -> bool:
    """Does the policy read attention weights (H2O while decoding, SnapKV after a prompt)?"""
    return policy.attention_rows(1) > 0 or policy.attention_rows(2) > 0


def _refuse(method: str) -> UnsupportedCombination:
    return UnsupportedCombination(
        f"PolicyCache does not support {method} (beam search, several sequences per prompt, assisted decoding): "
        "its policy decides slot by slot; generate greedily or by sampling with one sequence per prompt")


class PolicyLayer(CacheLayerMixin):
    """One layer of a ``PolicyCache``: hands each update to the course's cache of its owner."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, owner: PolicyCache, layer_idx: int) -> None:
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device, self.is_initialized = key_states.device, True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """key_states, value_states: [B, H_kv, T, d] (keys rotated at the stream's positions, RoPE models).
        Returns every slot the layer attends with: [B, H_kv, S, d] each."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.owner._update(self.layer_idx, key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner._slots_after(self.layer_idx, query_length), 0

    def get_seq_length(self) -> int:
        return self.owner.seen

    def get_max_length(self) -> int:
        budget = self.owner.policy.budget
        return -1 if budget is None else budget

    def reset(self) -> None:
        raise _refuse("reset")

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise _refuse("reorder_cache")

    def crop(self, tokens_to_remove: int) -> None:
        raise _refuse("crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise _refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: Tensor) -> None:
        raise _refuse("batch_select_indices")


class PolicyCache(Cache):
    """A transformers 5 ``Cache`` whose slots a course ``Policy`` manages. One cache per generation.

    ``model``: a transformers causal LM of the GPT-2 or Llama family (Llama, Mistral, Qwen2); ``policy``: from
    ``course.policies.make_policy``. Refused at construction, before any work: a policy the family cannot run
    (position re-assignment on GPT-2), a policy that reads attention weights on an implementation that returns
    none (anything but ``attn_implementation="eager"``), and models the course does not load.
    The cache registers hooks on the model; they act only on forwards that use this cache (``close()`` removes them).
    """

    def __init__(self, model, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a course Policy (course.policies.make_policy), got {type(policy).__name__}")
        self.config = course_config(model)
        policy.check_model(self.config)  # GPT-2: no position re-assignment
        self.model, self.policy = model, policy
        self._check_implementation()
        super().__init__(layers=[PolicyLayer(self, i) for i in range(self.config.n_layer)])
        self.kv: KVCache | None = None
        self._active = False
        self._tokens = 0
        self._rotate = self.config.reassigns_positions and policy.position_rule == "cache"
        base = model.base_model
        attentions = [m for m in base.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
        if len(attentions) != self.config.n_layer:
            raise UnsupportedCombination(f"found {len(attentions)} attention modules in {type(model).__name__} for "
                                         f"{self.config.n_layer} layers: this architecture is not supported")
        self._hooks = [base.register_forward_pre_hook(self._before, with_kwargs=True),
                       base.register_forward_hook(self._after, with_kwargs=True)]
        if needs_attention_weights(policy):
            self._hooks += [m.register_forward_hook(self._observe) for m in attentions]

    # ----------------------------------------------------------------------------- checks
    def _check_implementation(self) -> None:
        impl = getattr(self.model.config, "_attn_implementation", None)
        if needs_attention_weights(self.policy) and impl != WEIGHTS_IMPLEMENTATION:
            raise UnsupportedCombination(
                f"{self.policy.label} reads attention weights, which only attn_implementation="
                f"{WEIGHTS_IMPLEMENTATION!r} returns; this model runs {impl!r} (fused kernels never materialise "
                "the weights). Load it with attn_implementation='eager', or pick a policy that reads none "
                "(window, streaming, random)")

    def _before(self, module, args, kwargs) -> None:
        """Base model pre-hook: refuse what the cache cannot do exactly; make the course cache on the first call."""
        self._active = kwargs.get("cache") is self or kwargs.get("past_key_values") is self
        if not self._active:
            return
        self._check_implementation()
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        shape = ids.shape if ids is not None else embeds.shape[:2]
        b, t = int(shape[0]), int(shape[1])
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor) and mask.dim() == 2 and not bool(mask.all()):
            raise UnsupportedCombination(
                "PolicyCache does not support padded batches (left padding): its slots hold one stream per row with "
                "no padding; generate prompts of one length together, or one prompt at a time")
        if isinstance(mask, Tensor) and mask.dim() != 2:
            raise UnsupportedCombination("PolicyCache needs a 2-D attention_mask (or none), not a prepared 4-D mask")
        if t > 1 and self.seen > 0:
            raise UnsupportedCombination(
                f"a forward of {t} tokens on a cache that already holds {self.seen}: PolicyCache runs one prompt and "
                "then one token per step (no chunked prefill, no continuing a prompt); start a new PolicyCache")
        pos = kwargs.get("position_ids")
        if isinstance(pos, Tensor):
            expected = torch.arange(self.seen, self.seen + t, device=pos.device)
            if pos.dim() != 2 or not bool((pos == expected).all()):
                raise UnsupportedCombination(
                    "position_ids must be the stream's positions seen..seen+T-1 in every row (no padding, no packed "
                    "sequences): the policy decides positions inside the cache")
        if self.kv is None:
            c = self.config
            self.kv = KVCache(c.n_layer, b, c.n_kv_head, c.head_dim, policy=self.policy, dtype=self.model.dtype,
                              device=self.model.device, chunks="prompt")
        self._tokens = t

    def _after(self, module, args, kwargs, output) -> None:
        """Base model post-hook: the stream advances; a prompt is compressed to the policy's budget (as
        ``course.compression.compress_prompt``)."""
        if not self._active:
            return
        self._active = False
        self.kv.advance(self._tokens)
        if self._tokens > 1:
            self.kv.compress()

    def _observe(self, module, args, output) -> None:
        """Attention-module hook: its weights [B, H, T, S] go to the policy (eager attention only)."""
        if self._active:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise UnsupportedCombination(f"{self.policy.label} needs attention weights but layer "
                                             f"{module.layer_idx} returned none: use attn_implementation='eager'")
            self.kv.observe(module.layer_idx, weights)

    # ----------------------------------------------------------------------------- the layer's calls
    def _update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        kv = self.kv
        if kv is None or not self._active:
            raise UnsupportedCombination("PolicyCache must be passed to the model's forward as past_key_values/cache "
                                         "(its hooks on the model drive it)")
        b, _, t, _ = k.shape
        pos = torch.arange(kv.seen, kv.seen + t, device=k.device).expand(b, t)
        view = kv.update(layer_idx, k, v, pos)
        if self._rotate:
            self._place(layer_idx, pos - view.q_rope, view.k_rope, view.positions)
        keys, values, _ = kv.layers[layer_idx].live()
        return keys, values

    @torch.no_grad()
    def _place(self, layer_idx: int, shift: Tensor, k_rope: Tensor, k_pos: Tensor) -> None:
        """Keep every key rotated at ``k_rope + shift`` (shift = q_pos - q_rope, [B, T], one value per row), so that
        queries rotated at their stream positions see each key at the policy's distance q_rope - k_rope.
        Only keys whose rotation changes are rotated (by the difference); new keys arrive at offset 0."""
        layer = self.kv.layers[layer_idx]
        if shift.shape[-1] > 1 and not bool((shift == shift[:, :1]).all()):
            raise UnsupportedCombination("the queries of one forward would need different shifts")  # never with t>1 prompts
        wanted = (k_rope + shift[:, :1, None] - k_pos).to(torch.float32)  # [B, H_kv, S]
        have = layer.stat(OFFSET)
        changed = (wanted != have).nonzero(as_tuple=True)
        if changed[0].numel() == 0:
            return
        keys = layer.keys[:, :, : layer.length]
        delta = (wanted - have)[changed].to(torch.long)
        keys[changed] = rope(keys[changed][None, None], delta[None, None], self.config.rope_theta)[0, 0]
        have[changed] = wanted[changed]

    def _slots_after(self, layer_idx: int, query_length: int) -> int:
        """How many slots layer ``layer_idx`` attends with after storing ``query_length`` new tokens."""
        n = 0 if self.kv is None else self.kv.layers[layer_idx].length
        budget = self.policy.budget
        if query_length == 1 and budget is not None and n >= budget:
            return n
        return n + query_length

    # ----------------------------------------------------------------------------- state
    @property
    def seen(self) -> int:
        """Tokens of the stream processed so far (the next token's original position)."""
        return 0 if self.kv is None else self.kv.seen

    @property
    def n_slots(self) -> int:
        """Slots in use in the fullest layer (tokens cached per KV head)."""
        return 0 if self.kv is None else self.kv.n_slots

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions of the cached tokens of a layer: [B, H_kv, S]."""
        if self.kv is None:
            raise ValueError("the cache is empty: run a forward first")
        return self.kv.positions(layer_idx)

    def close(self) -> None:
        """Remove the hooks from the model (the cache is then unusable)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def reset(self):
        raise _refuse("reset")

    def reorder_cache(self, beam_idx: Tensor):
        raise _refuse("reorder_cache")

    def crop(self, tokens_to_remove: int) -> None:
        raise _refuse("crop")

    def batch_repeat_interleave(self, repeats: int):
        if repeats != 1:
            raise _refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: Tensor):
        raise _refuse("batch_select_indices")

    def __repr__(self) -> str:
        return f"PolicyCache(policy={self.policy!r}, seen={self.seen}, slots={self.n_slots})"
