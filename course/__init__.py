"""attention-sinks-course: how LLM serving survives the KV cache.

Readable, device-agnostic PyTorch for every mechanism the notebooks teach: models that own
their KV cache (``course.models``), the cache (``course.kvcache``), eviction policies
(``course.policies``), streaming evaluation (``course.streaming``), attention analysis
(``course.attention``), data and assets (``course.data``, ``course.assets``).
"""

__version__ = "0.1.0"
