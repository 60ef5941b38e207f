"""The course's policies inside transformers: a ``Cache`` for ``model.generate()``.

    from course.policies import make_policy
    from course.transformers_cache import PolicyCache, course_config

    policy = make_policy("streaming", 256, model=course_config(hf_model))
    batch = tokenizer(prompts, return_tensors="pt", padding=True)  # tokenizer.padding_side = "left"
    with PolicyCache(hf_model, policy) as cache:
        out = hf_model.generate(**batch, cache=cache, max_new_tokens=2000, do_sample=False)

The cache keeps its slots in the course's own ``KVCache`` (``course.kvcache``), managed by the policy, so
eviction, prompt compression (SnapKV), accumulated attention (H2O) and pinned sinks are the course's code,
not a second copy of it. What this module adds is the glue to transformers 5:

* **Positions.** transformers rotates queries and keys (RoPE) before the cache sees the keys, at the positions
  ``generate`` passes: the true positions of each row's stream. Under the *original* rule that is what the policy
  wants, and cached keys are never touched again. Under the *cache* rule (StreamingLLM) every key must sit at its
  slot's rank and the query at its own slot; RoPE scores depend only on the distance between query and key, so
  the cache keeps each key rotated at ``k_rank + (q_pos - q_rank)``: the true distance in the rotation becomes the
  in-cache distance. The course's ``KVCache`` does it (``rope_theta``): a key is rotated again only when that
  position changes (StreamingLLM: the sinks; the window keys never move), and always from the key as it arrived,
  by its whole offset, in float32, so half precision does not drift however long the stream.
* **Batches.** Prompts of different lengths come left-padded, as ``generate`` wants them. Each row keeps its own
  stream: positions count from its first real token, its first tokens are its sinks, and the padding sits in slots
  no query sees and no policy keeps (the cache hands transformers a mask of its slots). Beam search reorders the
  rows (``reorder_cache``); ``num_return_sequences`` and sampling need nothing more.
* **Lengths.** ``get_seq_length()`` is the number of tokens the stream has had (``generate`` slices its inputs
  and GPT-2 takes its learned positions from it); ``get_mask_sizes()`` is the number of slots attended to.
* **Attention weights** (H2O, SnapKV) come from a forward hook on each attention module; only
  ``attn_implementation="eager"`` returns them, so those policies refuse the others before any work.
* **Compression** after a prompt and the stream counter are driven by hooks on the base model.
* **Lifetime.** The model's hooks hold the cache only weakly: a cache nobody holds any more (for instance one
  passed inline, ``generate(..., cache=PolicyCache(m, p))``) is freed at once, hooks, slots and all; ``with
  PolicyCache(...) as cache:`` frees them when the block ends, and ``close()`` at any time.
* **Before any work.** The cache puts a check in front of ``model.generate`` (removed with the last open cache of
  the model) that refuses, in one line, what it cannot run with the arguments given: GPT-2 past its learned
  positions, decoding methods that undo steps (assisted decoding, contrastive search, chunked prefill), and input
  that does not continue the stream the cache already holds.

* **A quantized store** (``make_policy(..., quantizer=KIVI(bits=2))``, any policy) rounds the keys as transformers
  hands them over, rotated (KIVI's placement; ``course.quantize``), each batch row at its own stream's positions.

Supported: the GPT-2 family (original positions only: its positions are learned and added at the input) and
the Llama family as the course loads it (Llama, Mistral and Qwen2 without sliding-window layers or RoPE
scaling); greedy decoding, sampling, beam search and ``num_return_sequences``, one prompt or a left-padded batch.
Refused, by name: right padding, a multi-token forward on a cache that already holds tokens (chunked prefill,
continuing with several new tokens at once), ``crop`` (assisted decoding: evictions cannot be undone). A cache
holds one stream: continuing it takes the whole stream so far plus one new token (``generate`` on the previous
output does that); any other input is refused until ``reset()``, which starts afresh.

The layers transformers sees, the hooks on the model, the check in front of ``generate`` and the refusals live in
``course.transformers_glue``; this module is the cache itself.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from course.headwise import HeadwiseCache, HeadwisePolicy
from course.kvcache import KVCache
from course.policies import Policy
from course.transformers_glue import (
    DECODING,
    WEIGHTS_IMPLEMENTATION,
    Hook,
    course_cache,
    head_mask,
    PolicyLayer,
    UnsupportedCombination,
    course_config,
    install_check,
    needs_attention_weights,
    no_crop,
    release,
)

__all__ = ["PolicyCache", "PolicyLayer", "UnsupportedCombination", "course_config", "needs_attention_weights"]

class PolicyCache(Cache):
    """A transformers 5 ``Cache`` whose slots a course ``Policy`` manages. One stream per cache (a batch of prompts
    is one stream per row).

    ``model``: a transformers causal LM of the GPT-2 or Llama family (Llama, Mistral, Qwen2); ``policy``: from
    ``course.policies.make_policy``. Refused at construction, before any work: a policy the family cannot run
    (position re-assignment on GPT-2), a policy that reads attention weights on an implementation that returns
    none (anything but ``attn_implementation="eager"``), and models the course does not load.
    The cache registers hooks on the model; they act only on forwards that use this cache, and hold it weakly.
    ``with PolicyCache(model, policy) as cache:`` (or ``close()``) removes them and frees the slots.
    """

    def __init__(self, model, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a course Policy (course.policies.make_policy), got {type(policy).__name__}")
        self.config = course_config(model)
        policy.check_model(self.config)  # GPT-2: no position re-assignment
        self.model, self.policy = model, policy
        self._check_implementation()
        base = model.base_model
        attentions = [m for m in base.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
        if len(attentions) != self.config.n_layer:
            raise UnsupportedCombination(f"found {len(attentions)} attention modules in {type(model).__name__} for "
                                         f"{self.config.n_layer} layers: this architecture is not supported")
        super().__init__(layers=[PolicyLayer(self, i) for i in range(self.config.n_layer)])
        self.kv: KVCache | HeadwiseCache | None = None
        self._ids: Tensor | None = None  # [B, capacity] the stream's token ids so far (a continuation must repeat them)
        self._active = False
        self._tokens = 0
        self._pos: Tensor | None = None  # [B, T] the current forward's positions in each row's stream (-1: padding)
        hooks = [base.register_forward_pre_hook(Hook(self, "_before"), with_kwargs=True),
                 base.register_forward_hook(Hook(self, "_after"), with_kwargs=True)]
        if needs_attention_weights(policy):
            hooks += [m.register_forward_hook(Hook(self, "_observe")) for m in attentions]
        if isinstance(policy, HeadwisePolicy):  # heads of different lengths: a mask per head at every decode step
            hooks += [m.register_forward_pre_hook(Hook(self, "_head_mask"), with_kwargs=True) for m in attentions]
        self._hooks = hooks
        install_check(model)
        self._finalizer = weakref.finalize(self, release, hooks, weakref.ref(model))

    # ----------------------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Remove the hooks from the model and free the slots (the cache is then unusable)."""
        self._finalizer()
        self._hooks = []
        self.kv, self._ids = None, None

    def __enter__(self) -> PolicyCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the stream: the next forward is a new prompt (of any batch size)."""
        self.kv, self._ids = None, None

    # ----------------------------------------------------------------------------- checks
    def _check_implementation(self) -> None:
        impl = getattr(self.model.config, "_attn_implementation", None)
        if needs_attention_weights(self.policy) and impl != WEIGHTS_IMPLEMENTATION:
            raise UnsupportedCombination(
                f"{self.policy.label} reads attention weights, which only attn_implementation="
                f"{WEIGHTS_IMPLEMENTATION!r} returns; this model runs {impl!r} (fused kernels never materialise "
                "the weights). Load it with attn_implementation='eager', or pick a policy that reads none "
                "(window, streaming, random)")

    def check_generate(self, model, *args, **kwargs) -> None:
        """Refuse, before any work and in one line, a ``generate`` call this cache cannot run: a decoding method
        that undoes steps, GPT-2 past its learned positions, input that does not continue the stream the cache
        holds. (Called by the check the cache puts in front of ``model.generate``.)"""
        if model is not self.model:
            raise UnsupportedCombination("this PolicyCache belongs to another model: make one for this model")
        if not self._finalizer.alive:
            raise UnsupportedCombination("this PolicyCache is closed: make a new one")
        params = inspect.signature(type(model).generate).parameters
        bound = {name: value for name, value in zip(list(params)[1:], args)}
        gen_kwargs = {k: v for k, v in kwargs.items() if k not in params}
        config, _ = model._prepare_generation_config(kwargs.get("generation_config", bound.get("generation_config")),
                                                     **gen_kwargs)
        mode = config.get_generation_mode(kwargs.get("assistant_model", bound.get("assistant_model"))).value
        if mode not in DECODING:
            raise UnsupportedCombination(
                f"PolicyCache does not support {mode.replace('_', ' ')}: it undoes or regroups decoding steps, and the "
                "policy's evictions cannot be undone; use greedy decoding, sampling or beam search")
        if config.prefill_chunk_size is not None:
            raise UnsupportedCombination("PolicyCache does not support chunked prefill (prefill_chunk_size): a prompt "
                                         "runs in one forward, then one token per step")
        ids = kwargs.get("input_ids", kwargs.get("inputs", bound.get("inputs")))
        embeds = kwargs.get("inputs_embeds")
        fed = ids if isinstance(ids, Tensor) else embeds
        if not isinstance(fed, Tensor):
            return  # transformers starts from a BOS token: nothing to check here
        length = int(fed.shape[1])
        new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - length
        mask = kwargs.get("attention_mask")
        longest = int(mask.sum(-1).max()) if isinstance(mask, Tensor) and mask.dim() == 2 else length
        self._check_positions(longest + max(new, 1) - 1, f"generating {new} tokens after {longest}")
        if self.seen:
            self._check_continuation(ids, config)

    def _check_positions(self, n_tokens: int, what: str) -> None:
        """GPT-2: refuse a stream longer than its learned positions, by name (a RoPE model has no such limit)."""
        try:
            self.config.check_tokens(n_tokens, what)
        except ValueError as e:
            raise UnsupportedCombination(f"{e} (PolicyCache keeps GPT-2's original positions)") from None

    def _check_continuation(self, ids: Tensor | None, config) -> None:
        """A used cache: the input must be its stream so far plus one new token, row for row."""
        seen, rows = self.seen, self.kv.shape[1]
        why = None
        if not isinstance(ids, Tensor) or self._ids is None:
            why = "token ids are needed to continue a stream (not inputs_embeds)"
        elif config.num_beams > 1 or config.num_return_sequences > 1:
            why = "num_beams and num_return_sequences expand a prompt, not a stream already running"
        elif ids.shape[0] != rows or ids.shape[1] != seen + 1:
            why = f"input_ids of shape {tuple(ids.shape)}, not [{rows}, {seen + 1}] (the stream so far and one token)"
        elif not torch.equal(ids[:, :seen].to(self._ids.device), self._ids[:, :seen]):
            why = "input_ids do not begin with the stream so far"
        if why is not None:
            raise UnsupportedCombination(
                f"this PolicyCache already holds a stream of {seen} tokens and this generate call does not continue it "
                f"({why}): pass a new PolicyCache for a new prompt, or call cache.reset() first")

    def _left_padding(self, mask: Tensor | None, b: int, t: int) -> Tensor | None:
        """The prompt's padding per row ([B] long) from its 2-D attention mask, or None without padding; refuses
        right padding and holes."""
        if not isinstance(mask, Tensor) or bool(mask.all()):
            return None
        m = mask.to(torch.long)
        if tuple(m.shape) != (b, t):
            raise UnsupportedCombination(f"attention_mask of shape {tuple(mask.shape)} for a prompt of {(b, t)}")
        if not bool((m[:, 1:] >= m[:, :-1]).all()):
            side = "right padding" if not bool(m[:, -1].all()) else "padding inside a prompt"
            raise UnsupportedCombination(
                f"PolicyCache does not support {side}: pad batches of prompts on the left (tokenizer.padding_side = "
                "'left'), as generate expects for decoder-only models")
        if not bool(m[:, -1].all()):
            raise UnsupportedCombination("a prompt of the batch is empty (only padding): give each row a token")
        return (m == 0).sum(-1)

    def _before(self, module, args, kwargs):
        """Base model pre-hook: refuse what the cache cannot do exactly; make the course cache on a prompt; hand
        transformers each row's positions and, in a padded batch, the mask of the slots it may attend to."""
        self._active = kwargs.get("cache") is self or kwargs.get("past_key_values") is self
        if not self._active:
            return None
        if not self._finalizer.alive:
            raise UnsupportedCombination("this PolicyCache is closed: make a new one")
        self._check_implementation()
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        shape = ids.shape if ids is not None else embeds.shape[:2]
        b, t = int(shape[0]), int(shape[1])
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor) and mask.dim() != 2:
            raise UnsupportedCombination("PolicyCache needs a 2-D attention_mask (or none), not a prepared 4-D mask")
        if t > 1 and self.seen > 0:
            raise UnsupportedCombination(
                f"a forward of {t} tokens on a cache that already holds {self.seen}: PolicyCache runs one prompt and "
                "then one token per step (no chunked prefill, no continuing with several tokens at once); start a "
                "new PolicyCache or call cache.reset()")
        self._check_positions(self.seen + t, "this forward")  # GPT-2: by name, before its IndexError
        if self.kv is None:
            self.kv = course_cache(self.policy, self.config, b, self.model, self._left_padding(mask, b, t))
            self._ids = None if ids is None else torch.full((b, max(64, 2 * t)), -1, dtype=torch.long,
                                                            device=ids.device)
        elif b != self.kv.shape[1]:
            raise UnsupportedCombination(f"a forward of batch {b} on a cache of {self.kv.shape[1]} rows: one stream "
                                         "per row (call cache.reset() for a new batch)")
        elif isinstance(mask, Tensor) and not bool(mask[:, -t:].all()):
            raise UnsupportedCombination("padding after the prompt: only the prompt may be (left-)padded")
        kv, start = self.kv, self.kv.start
        pos = torch.arange(kv.seen, kv.seen + t, device=self.model.device).expand(b, t)
        if start is not None:
            pos = pos - start.to(pos.device)[:, None]
            pos = pos.masked_fill(pos < 0, -1)  # padding
        given = kwargs.get("position_ids")
        if isinstance(given, Tensor):
            if given.dim() != 2 or not bool(((given == pos) | (pos < 0)).all()):
                raise UnsupportedCombination(
                    "position_ids must be each row's stream positions (0 at its first real token) in every row (no "
                    "packed sequences): the policy decides positions inside the cache")
        elif start is not None:
            kwargs["position_ids"] = pos.clamp(min=0)
        if kv.seen and start is not None:  # decoding a padded batch: transformers attends to the cache's slots
            kwargs["attention_mask"] = self._slot_mask(t)
        self._pos, self._tokens = pos, t
        self._record(ids, t)
        return args, kwargs

    def _slot_mask(self, t: int) -> Tensor | None:
        """The slots each row may attend to after this step's update ([B, S] bool; None: all of them). Padding
        sits at the same slots of every layer and head of a row, and is always the first slot evicted."""
        layer = self.kv.layers[0]
        n = layer.length
        real = layer.positions[:, 0, :n] >= 0  # [B, n]
        if bool(real.all()):
            return None
        budget = self.policy.budget
        if t == 1 and budget is not None and n >= budget:  # the new token takes each row's first padding slot
            first = (~real).to(torch.int8).argmax(-1)
            real = real.clone()
            real[torch.arange(real.shape[0], device=real.device), first] = True
            return real
        return torch.cat([real, real.new_ones(real.shape[0], t)], dim=-1)

    def _record(self, ids: Tensor | None, t: int) -> None:
        """Keep the stream's token ids (a later generate call must continue them)."""
        if ids is None or self._ids is None:
            self._ids = None
            return
        seen = self.kv.seen
        if seen + t > self._ids.shape[1]:
            grown = self._ids.new_full((self._ids.shape[0], 2 * (seen + t)), -1)
            grown[:, :seen] = self._ids[:, :seen]
            self._ids = grown
        self._ids[:, seen : seen + t] = ids

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
        """Attention-module hook: its weights [B, H, T, S] go to the policy (eager attention only). Padding
        queries give none (a padded batch's fully masked rows)."""
        if not self._active:
            return
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise UnsupportedCombination(f"{self.policy.label} needs attention weights but layer "
                                         f"{module.layer_idx} returned none: use attn_implementation='eager'")
        if self.kv.start is not None and self._tokens > 1:  # (a fully masked row may even be NaN)
            weights = weights.masked_fill((self._pos < 0)[:, None, :, None], 0.0)
        self.kv.observe(module.layer_idx, weights)

    def _head_mask(self, module, args, kwargs):
        """Attention-module pre-hook under a ``HeadwisePolicy``: a decode step attends with each head's own slots
        (``head_mask``; a prompt's forward finds every head holding the same tokens, under transformers' mask)."""
        if not self._active or self._tokens > 1:
            return None
        kwargs["attention_mask"] = head_mask(self.kv, module.layer_idx, self.config.n_head, self.model.dtype)
        return args, kwargs

    # ----------------------------------------------------------------------------- the layer's calls
    def _update(self, layer_idx: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        kv = self.kv
        if kv is None or not self._active:
            raise UnsupportedCombination("PolicyCache must be passed to the model's forward as past_key_values/cache "
                                         "(its hooks on the model drive it), and not be closed")
        if kv.start is not None and self._tokens > 1:  # a padded prompt: its padding is stored as zeros (a fully
            pad = (self._pos < 0)[:, None, :, None]  # masked query can turn NaN, e.g. eager attention in float64,
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)  # and 0 * NaN would reach the real queries)
        view = kv.update(layer_idx, k, v, self._pos, mask=False)
        return view.keys, view.values

    def _slots_after(self, query_length: int) -> int:
        """How many slots every layer attends with after storing ``query_length`` new tokens."""
        if isinstance(self.kv, HeadwiseCache):
            return int(self.kv.lengths_after(0, query_length).max())
        n = 0 if self.kv is None else self.kv.layers[0].length
        budget = self.policy.budget
        if query_length == 1 and budget is not None and n >= budget:
            return n
        return n + query_length

    # ----------------------------------------------------------------------------- rows: beams, repeats
    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Beam search: keep the rows ``beam_idx`` (every slot, position and policy statistic moves with its row)."""
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.kv is None:
            return
        index = indices.to(self.kv.layers[0].keys.device, torch.long)
        self.kv.select_rows(index)
        if self._ids is not None:
            self._ids = self._ids.index_select(0, index.to(self._ids.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.kv is not None and repeats != 1:
            rows = torch.arange(self.kv.shape[1], device=self.kv.layers[0].keys.device)
            self.batch_select_indices(rows.repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        raise no_crop()

    # ----------------------------------------------------------------------------- state
    @property
    def seen(self) -> int:
        """Tokens of the stream processed so far (the next token's original position, plus a row's padding)."""
        return 0 if self.kv is None else self.kv.seen

    @property
    def n_slots(self) -> int:
        """Slots in use in the fullest layer (tokens cached per KV head, padding included)."""
        return 0 if self.kv is None else self.kv.n_slots

    def positions(self, layer_idx: int = 0) -> Tensor:
        """Original positions of the cached tokens of a layer (in each row's stream; -1: padding): [B, H_kv, S]."""
        if self.kv is None:
            raise ValueError("the cache is empty: run a forward first")
        return self.kv.positions(layer_idx)

    def __repr__(self) -> str:
        return f"PolicyCache(policy={self.policy!r}, seen={self.seen}, slots={self.n_slots})"
