"""Which heads need the whole cache: retrieval heads, the causal test of masking them, and their sink mass.

``retrieval``  the retrieval score per query head (Wu et al. 2024), its KV-head view, the top heads
``ablation``   zeroing heads' outputs before W_O, the random control, needle accuracy with an interval
``sink_mass``  sink mass per head, to set beside the score
``gates``      DuoAttention's per-KV-head gates between full and streaming attention, trained on passkeys
"""

from course.heads.ablation import masked_heads, needle_accuracy_masked, random_heads
from course.heads.gates import gated_attention, gated_heads, optimize_gates, streaming_mask
from course.heads.retrieval import copy_hits, kv_head_scores, retrieval_scores, top_heads, top_share
from course.heads.sink_mass import head_sink_mass

__all__ = ["copy_hits", "retrieval_scores", "kv_head_scores", "top_heads", "top_share", "masked_heads",
           "random_heads", "needle_accuracy_masked", "head_sink_mass", "streaming_mask", "gated_attention",
           "gated_heads", "optimize_gates"]
