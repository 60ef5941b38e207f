"""attention-sinks-course: how LLM serving survives the KV cache.

Readable, device-agnostic PyTorch for every mechanism the notebooks teach. The map of the package (the runtime
path reads policy -> cache -> attention, the cache in layers: slots below, policies and stores beside each other, the
cache composing them; ``tests/test_package.py`` checks that this map names every module):

What a student's kernel imports
  ``course.slots``               one layer's cached slots (keys, values, positions): the floor of the cache
  ``course.policies``            eviction policies behind one interface, one file each, and the table that declares them
  ``course.storage``             how kept tokens are stored: the protocol, its table, full precision, KIVI
  ``course.function_policy``     policies whose decisions are a notebook's own functions of tensors
  ``course.kvcache``             the KV cache: a policy and a store composed, eviction, prompt compression
  ``course.headwise``            caches whose heads hold different lengths: DuoAttention, PyramidKV, Ada-KV
  ``course.rope``                the rotary position embedding the models and the cache share
  ``course.models``              models that own their KV cache (one ``Family`` per architecture; ``attend``)
  ``course.compression``         the one prompt-compression step that generation and evaluation share
  ``course.quantize``            the quantized store (KIVI) and its rounding, as notebook 08 uses them
  ``course.streaming``           a long text through a bounded cache: perplexity and what it costs
  ``course.frontier``            quality against bytes: eviction, quantization and both on the same passages
  ``course.equal_bytes``         stores compared at the same bytes: what a store holds, eviction given as much
  ``course.rounding_error``      what rounding a key does to attention: logit error and weight moved
  ``course.evaluate``            needle retrieval under a compressed cache, continuations, budget sweeps
  ``course.generate``            generation and chat through a compressed cache
  ``course.transformers_cache``  the course's policies inside transformers' ``generate``
  ``course.transformers_glue``   that cache's layers, hooks on the model, the check before ``generate``, refusals
  ``course.attention_analysis``  where attention goes: sink mass, sink heads, residual and value norms, ablation
  ``course.heads``               which heads retrieve: retrieval scores, masking heads, their sink mass
  ``course.train``               tiny models pretrained with and without a sink token or sink logit
  ``course.training``            its rooms: the tasks, the variants, the training loop, the measurements
  ``course.splits``              exploration and confirmation data kept apart (text ranges, seeds, the record)
  ``course.passages``            results over many passages (spreads, intervals)
  ``course.stats``               intervals every verdict is judged on (order statistics of the median), paired tests
  ``course.claims``              the scientific claims a notebook asserts, and their verdicts
  ``course.papers``              the published numbers the course quotes
  ``course.memory``              bytes per token of a KV cache for current models' layouts
  ``course.timing``              timings measured side by side, the policies' speed and memory
  ``course.threads``             how many torch threads to use here
  ``course.builds``              what the build exercises plug into
  ``course.exercises``           every notebook's checkers and ``check`` (what a check cell calls)
  ``course.syllabus``            the notebooks, in order: the one table everything that lists them reads
  ``course.notebook``            the lines every notebook runs after its parameters cell
  ``course.plots``               the notebooks' figures
  ``course.head_plots``          notebook 09's figures: per head, per condition, the head-wise frontier
  ``course.widgets``             the interactive explorers (attention maps, what a cache keeps)
  ``course.progress``            one progress bar for every long loop
  ``course.data``                texts: the Austen novels offline, local files, PG-19 / wikitext online
  ``course.assets``              where the models and texts come from and where they are kept
  ``course.manifest``            checksums of a cache folder's files
  ``course.model_names``         the model, device and seed names the course accepts

The command line (``python -m course``), the door to both rooms
  ``course.cli``                 one module per command group

What the instructor keeps (never imported by the above)
  ``course.instructor``          grading, release, site, host, benchmarks of the notebooks and of grading
"""

__version__ = "0.1.0"
