"""The glue between a ``PolicyCache`` (``course.transformers_cache``) and transformers: its per-layer ``Cache``
layers, the course cache it keeps its slots in (``course_cache``) and, when the heads hold different lengths, the
per-head mask it hands transformers' attention (``head_mask``), the hooks it puts on the model (holding it weakly),
the check it puts in front of ``model.generate``, and what it refuses (``UnsupportedCombination``)."""

from __future__ import annotations

import types
import weakref

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from course.headwise import HeadwiseCache, HeadwisePolicy
from course.kvcache import KVCache
from course.models import config_from_hf
from course.models.base import ModelConfig
from course.policies import Policy

__all__ = ["PolicyLayer", "UnsupportedCombination", "course_config", "needs_attention_weights", "Hook", "no_crop",
           "install_check", "release", "WEIGHTS_IMPLEMENTATION", "DECODING", "course_cache", "head_mask"]

WEIGHTS_IMPLEMENTATION = "eager"  # the only attention implementation of transformers that returns weights
DECODING = ("greedy_search", "sample", "beam_search", "beam_sample")  # generate's modes that never undo a step


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


def course_cache(policy: Policy, config: ModelConfig, batch: int, model,
                 start: Tensor | None) -> KVCache | HeadwiseCache:
    """The course cache a ``PolicyCache`` keeps its slots in, for a prompt of ``batch`` rows (``start``: [B] each
    row's left padding, or None): keys arrive rotated at their original positions (RoPE models). A
    ``HeadwisePolicy`` gets a ``HeadwiseCache`` (rows without padding only)."""
    theta = config.rope_theta if config.reassigns_positions else None
    if isinstance(policy, HeadwisePolicy):
        if start is not None:
            raise UnsupportedCombination(f"{policy.label} holds different lengths per head, which PolicyCache runs "
                                         "for prompts without padding only: generate one prompt at a time")
        return HeadwiseCache(policy, batch, config.head_dim, dtype=model.dtype, device=model.device, rope_theta=theta)
    kv = KVCache(config.n_layer, batch, config.n_kv_head, config.head_dim, policy=policy, dtype=model.dtype,
                 device=model.device, chunks="prompt", rope_theta=theta)
    kv.start = start
    return kv


def head_mask(kv: HeadwiseCache, layer_idx: int, n_heads: int, dtype: torch.dtype) -> Tensor:
    """The additive mask [B, H, 1, S_max] of one decode step of a layer of a ``HeadwiseCache``: 0 over the slots
    each query head's KV head will hold after the step (the first ``lengths_after`` of the padded view), the
    dtype's lowest number over the padding. transformers' eager and sdpa attention add it to the scores of every
    query head (GQA: query head q reads KV head q // G)."""
    lengths = kv.lengths_after(layer_idx, 1)  # [H_kv]
    device = kv.layers[layer_idx].keys.device
    real = torch.arange(int(lengths.max()), device=device) < lengths.to(device)[:, None]  # [H_kv, S_max]
    real = real.repeat_interleave(n_heads // lengths.shape[0], dim=0)  # [H, S_max]
    mask = torch.zeros(kv.shape[1], n_heads, 1, real.shape[1], dtype=dtype, device=device)
    return mask.masked_fill_(~real[None, :, None], torch.finfo(dtype).min)


class PolicyLayer(CacheLayerMixin):
    """One layer of a ``PolicyCache``: hands each update to the course's cache of its owner (held weakly, so that
    the owner and its layers form no reference cycle and a dropped cache is freed at once)."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, owner: Cache, layer_idx: int) -> None:
        super().__init__()
        self._owner, self.layer_idx = weakref.ref(owner), layer_idx

    @property
    def owner(self) -> Cache:
        owner = self._owner()
        if owner is None:
            raise UnsupportedCombination("this layer's PolicyCache no longer exists")
        return owner

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
        return self.owner._slots_after(query_length), 0

    def get_seq_length(self) -> int:
        return self.owner.seen

    def get_max_length(self) -> int:
        budget = self.owner.policy.budget
        return -1 if budget is None else budget

    # The cache acts on all layers at once (PolicyCache overrides these); a layer alone cannot.
    def reset(self) -> None:
        self.owner.reset()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise UnsupportedCombination("reorder a PolicyCache as a whole (PolicyCache.reorder_cache), not one layer")

    def crop(self, tokens_to_remove: int) -> None:
        raise no_crop()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise UnsupportedCombination("repeat the rows of a PolicyCache as a whole, not one layer")

    def batch_select_indices(self, indices: Tensor) -> None:
        raise UnsupportedCombination("select the rows of a PolicyCache as a whole, not one layer")


def no_crop() -> UnsupportedCombination:
    return UnsupportedCombination(
        "PolicyCache cannot crop (undo tokens): its policy's evictions cannot be undone, so decoding methods that "
        "roll back steps (assisted decoding, prompt lookup, contrastive search) are refused; use greedy decoding, "
        "sampling or beam search")


class Hook:
    """A model hook that calls a method of a cache through a weak reference: the model's hooks never keep a cache
    alive (a dropped cache removes its hooks when it is freed)."""

    def __init__(self, cache: Cache, method: str) -> None:
        self.cache, self.method = weakref.ref(cache), method

    def __call__(self, *args):
        cache = self.cache()
        return None if cache is None else getattr(cache, self.method)(*args)


# ----------------------------------------------------------------------------- the check in front of generate
_OPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> how many of its PolicyCaches are open


def generate(self, *args, **kwargs):
    """``model.generate`` while a ``PolicyCache`` is open on the model: the cache checks the call's arguments
    (``PolicyCache.check_generate``) before any work, then transformers' own ``generate`` runs unchanged."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    check = getattr(cache, "check_generate", None)  # a PolicyCache's (transformers' own caches have none)
    if callable(check):
        check(self, *args, **kwargs)
    return type(self).generate(self, *args, **kwargs)


def install_check(model) -> None:
    _OPEN[model] = _OPEN.get(model, 0) + 1
    if "generate" not in vars(model):
        model.generate = types.MethodType(generate, model)


def release(hooks: list, model_ref: weakref.ref) -> None:
    """Remove a cache's hooks and, with the model's last open cache, the check in front of its generate."""
    for h in hooks:
        h.remove()
    model = model_ref()
    if model is None or model not in _OPEN:
        return
    _OPEN[model] -= 1
    if _OPEN[model] == 0:
        del _OPEN[model]
        method = vars(model).get("generate")
        if getattr(method, "__func__", None) is generate:
            del model.generate
