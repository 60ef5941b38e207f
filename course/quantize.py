"""KV-cache quantization: fewer bits per number instead of fewer tokens.

Eviction keeps some tokens exactly and forgets the rest; quantization keeps every token, each a little wrong. KIVI
(Liu et al. 2024, arXiv 2402.02750) found what makes a 2-bit cache work: keys and values are not alike.

* **Keys per channel.** A few key channels carry outliers for every token, so one scale per *channel*, over a group
  of G consecutive tokens, fits each channel's range (KIVI §3.2). The course's models round keys before the rotary
  embedding by default, where the outlier channels stay put (KVQuant, Hooper et al. 2024, arXiv 2401.18079, §3.1,
  quantizes them there); in a cache of rotated keys (``new_cache(rotated=True)``, and transformers' ``PolicyCache``,
  which is handed rotated keys) they are rounded as they arrive, rotated, as KIVI's own code does, and a key the
  policy moves later (StreamingLLM's sinks) is rotated again from its rounded self.
* **Values per token.** Values have no fixed outlier channels; their error is averaged by the attention weights row
  by row, so one scale per *token*, over a group of G channels.
* **A full-precision residual.** The most recent ``residual`` tokens (and the tokens of a key group not yet full)
  stay in full precision; a key group is quantized once all of its G tokens are older than that.

Each group is quantized asymmetrically (KIVI eq. 2): with m = min, M = max over the group,

    scale = (M - m) / (2^b - 1),   code = round((x - m) / scale) in 0 .. 2^b - 1,   x' = code * scale + m.

**Sinks exact.** The first tokens of a stream carry the attention sinks, and their keys are not the largest: in
SmolLM2-135M, before RoPE, token 0's key is smaller than the median token's in 29 or 30 of the 30 layers (median over
KV heads; 87 of the 90 layer-head pairs, 0.15 to 1.2 times the median's norm, over 512 tokens of Austen at two
offsets; notebook 08, section 1, measures it on the model that runs). It differs from the rest of its key group, so
the per-channel step the others set does not fit it, and every query leans on it. A quantizer that keeps the first
``exact_sinks`` tokens in full precision loses much less (IntactKV, Liu et al. 2024, arXiv 2403.01241; the "preserve
the first N" baseline of KVSink, arXiv 2508.04257). ``KIVI(exact_sinks=4)`` stores
tokens 0..3 exactly and changes nothing else: the groups are those of the store without the option (the first group's
scales are computed over all its tokens, the sinks included), so the two stores differ in the first four slots only.

Simulated storage: the cache keeps ``x'`` (the dequantized numbers, exactly what unpacking the codes gives) in its
own tensors, so attention, every eviction policy and the model run unchanged; ``KIVI.nbytes`` counts what a packed
store holds: b-bit codes, a 16-bit scale and zero point per group, and the full-precision tokens.

A store is chosen beside a policy (``make_policy(name, budget, quantizer=KIVI(bits=4))``): the policy chooses which
tokens stay, the store how they are kept; the cache composes the two and calls the store's ``settle`` before it stores
each new token. The stores live in ``course.storage`` (the ``Storage`` protocol, ``KIVI``, its post-RoPE variant);
the rounding in ``course.storage.rounding``. This module gathers what notebook 08 and its exercises use.
"""

from course.storage.kivi import BITS, GROUP_STAT, KIVI, RoundingFunction
from course.storage.kivi_post_rope import KIVIPostRoPE
from course.storage.rounding import dequantize, error_by_token, fake_quantize, quantize

__all__ = ["KIVI", "KIVIPostRoPE", "RoundingFunction", "quantize", "dequantize", "fake_quantize", "GROUP_STAT",
           "error_by_token", "BITS"]
