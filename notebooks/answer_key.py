"""The answer key of the questions ("Check your understanding"): each answer, the hint for a typical wrong answer,
and the nudge for any other. The instructor's, never part of the installed package: ``python -m course release``
copies it into the grading key (and, unless ``--hide-answers``, into the questions' check cells, so that students
practising get feedback). Release stops when an answer here and the solution notebook's disagree.

The questions are about concepts and arithmetic that hold for every model of the course (GPT-2 and SmolLM2 alike),
never about one model's measurements.

A graded release (``release --key``) asks each question in a variant of its own: a choice question's options in
another order, a number question with a template (``numbers=Numbers(...)``) with other numbers. A template names
each number the question shows, with its value here and the values a variant may take, and gives the answer, the
typical wrong answers (one per hint, in order) and the question's text as formulas of them; release checks that on
the values here they give this key's answer, hints and the notebook's text.
"""

from course.exercises.questions import Numbers
from course.exercises.questions import QuestionKey as Key

_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _spaced(n: int) -> str:
    """100000 -> '100 000'."""
    return f"{n:,}".replace(",", " ")


def _zeros(n: int) -> str:
    """3 -> '0, 0 and 0'."""
    return ", ".join(["0"] * (n - 1)) + " and 0"


_SINK_HINT = "a head's attention must go somewhere: think of what happens to the share the first token received"

KEY: list[Key] = [
    # ------------------------------------------------------------------ 01 · the KV cache
    Key("01.q_bytes_per_token", 36864,
        "multiply: keys and values, layers, KV heads, head size, bytes per number",
        {18432: "check both factors of 2: a key AND a value per head, and 2 bytes per float16 number",
         73728: "float16 numbers take 2 bytes each, not 4",
         3072: "every layer stores its own keys and values: multiply by the number of layers"},
        numbers=Numbers(
            {"model": ("GPT-2 (124M)", ["A model"]), "layers": (12, range(8, 49, 4)),
             "kv_heads": (12, [1, 2, 4, 8, 16]), "head_dim": (64, [64, 80, 96, 128])},
            answer=lambda layers, kv_heads, head_dim: 2 * layers * kv_heads * head_dim * 2,
            wrong=(lambda answer: answer / 2, lambda answer: answer * 2, lambda answer, layers: answer / layers),
            text=lambda model, layers, kv_heads, head_dim: (
                f"{model} has {layers} layers and {kv_heads} KV heads of size {head_dim}. How many bytes does **one "
                "token** take in its cache in float16? (a number)"))),
    Key("01.q_gqa_factor", 4,
        "the cache holds one key and one value per KV head: compare the numbers of KV heads",
        {8: "the factor is how many query heads share one KV head",
         32: "the factor is how many query heads share one KV head",
         0.25: "give the factor by which it is smaller (a number greater than 1)"},
        numbers=Numbers(
            {"model": ("Llama-3-8B", ["A model"]), "query_heads": (32, [8, 12, 16, 24, 32, 40, 48, 64]),
             "kv_heads": (8, [2, 4, 8])},
            answer=lambda query_heads, kv_heads: query_heads / kv_heads,
            wrong=(lambda kv_heads: kv_heads, lambda query_heads: query_heads,
                   lambda query_heads, kv_heads: kv_heads / query_heads),
            valid=lambda query_heads, kv_heads: query_heads % kv_heads == 0 and query_heads > kv_heads,
            text=lambda model, query_heads, kv_heads: (
                f"{model} has {query_heads} query heads and {kv_heads} KV heads per layer. By what factor is its cache "
                "smaller than that of the same model with one KV head per query head? (a number)"))),
    Key("01.q_what_grows", "b",
        "compare what one cached step computes for the new token with what it reads from the cache",
        {"a": "the weight matrices process one new token per step, whatever the context length",
         "c": "the weight matrices process one new token per step, whatever the context length",
         "d": "the new token's query is compared with every cached key"},
        choices=("the products of the new token with the weight matrices",
         "the attention of the new query over the cached keys and values",
         "both the weight products and the attention over the cache",
         "neither: a cached step costs the same at every context length")),
    Key("01.q_exact", "c",
        "the cache stores the keys and values a full pass would compute anyway",
        {"a": "nothing is dropped or compressed: the cache stores exactly the keys and values a full pass "
              "computes",
         "b": "the cache changes how the logits are computed, not how a token is picked from them",
         "d": "nothing is compressed: the cache stores exactly the keys and values a full pass computes"},
        choices=("an approximation whose error grows with the length of the text",
         "the same logits, but only when decoding picks tokens greedily",
         "the same logits, up to the rounding of floating-point arithmetic",
         "different logits, because the cache stores compressed keys")),
    # ------------------------------------------------------------------ 02 · attention sinks
    Key("02.q_first_eviction", 64,
        "the window holds positions t - W + 1 .. t: find the first t at which that range no longer starts at 0",
        {63: "at t = 63 the cache holds positions 0..63, exactly W tokens: nothing has been evicted yet",
         65: "one step late: the window holds the W positions t - W + 1 .. t, the new token included",
         0: "token 0 is evicted only once the cache is full"},
        numbers=Numbers(
            {"window": (64, [16, 24, 32, 48, 96, 128, 256, 512])},
            answer=lambda window: window,
            wrong=((lambda window: window - 1, lambda window: f"at t = {window - 1} the cache holds positions "
                    f"0..{window - 1}, exactly W tokens: nothing has been evicted yet"),
                   lambda window: window + 1, lambda: 0),
            text=lambda window: (
                f"A window-only cache keeps the W = {window} most recent tokens, the current one included, and no "
                f"sinks (`kept_positions(t, {window}, 0)`). At which position t is token 0 missing from the cache for "
                "the first time? (a number)"))),
    Key("02.q_why_collapse", "d",
        _SINK_HINT,
        {"a": "replacing the first tokens by newlines costs little: their content is not what matters",
         "b": "a window keeps original positions, all of them already seen in training before the collapse",
         "c": "once full, the cache no longer grows"},
        choices=("the first token carries the most important content of the text",
         "the positions of the remaining tokens exceed those seen in training",
         "the cache runs out of memory once the first token is evicted",
         "heads that parked their attention on token 0 must spread it elsewhere")),
    Key("02.q_renormalise", 0.25,
        "after an eviction the softmax renormalises: the remaining weights sum to 1 again",
        {0.1: "the softmax renormalises: the remaining weights must sum to 1",
         0.4: "that is their old total; after renormalising they sum to 1: give one token's weight",
         0.15: "the share is not added equally: renormalising divides by the remaining total"}, tol=1e-3,
        numbers=Numbers(
            {"first": (0.6, [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]), "others": (4, [2, 3, 4, 5, 6, 8])},
            answer=lambda others: 1 / others,
            wrong=(lambda first, others: (1 - first) / others, lambda first: 1 - first,
                   lambda first, others: first / others),
            valid=lambda first, others: abs(round((1 - first) / others, 3) - (1 - first) / others) < 1e-9,
            text=lambda first, others: (
                f"A head puts weight {first:g} on token 0 and {(1 - first) / others:g} on each of {_WORDS[others]} "
                "other tokens. Token 0 is evicted and the softmax renormalises over what is left. What weight does "
                "each remaining token get? (a number)"))),
    Key("02.q_newlines", "c",
        "what did the newline tokens have in common with the tokens they replaced?",
        {"a": "a newline carries almost no content",
         "b": "the number of sinks is a different experiment",
         "d": "nothing is re-read: evicted tokens are gone from the cache"},
        choices=("newline tokens are more informative than the words they replace",
         "four sink tokens are always needed, whatever the model",
         "the sink role comes from being first, not from what the token says",
         "the model re-reads the evicted text through the newline tokens")),
    # ------------------------------------------------------------------ 03 · StreamingLLM
    Key("03.q_positions_seen", "b",
        "re-assigning numbers the cached tokens by their rank inside the cache",
        {"a": "those are the stream positions, what positions='original' uses",
         "c": "the sinks are among the cached tokens, and they are the oldest",
         "d": "the sinks are re-numbered together with the window"},
        choices=("their stream positions, 0–3 and 993–1000",
         "0–11, their ranks inside the cache",
         "989–1000, the last twelve stream positions",
         "0–3 for the sinks and 993–1000 for the window")),
    Key("03.q_what_changes", "d",
        "the cache keeps the same tokens either way; ask which positions the model gets to see",
        {"a": "a cached key is the same vector; only the rotation applied to it changes",
         "b": "which tokens stay is the policy's choice; positions say where the model believes they are",
         "c": "RoPE rotates every query and key by an angle proportional to its position"},
        choices=("the contents of the cached key and value vectors",
         "which tokens the cache keeps and which it evicts",
         "nothing at all, as long as the model uses RoPE",
         "its positions never exceed the cache size")),
    Key("03.q_rerotate", -493,
        "rotations add up: rotate by the difference between the new and the old position",
        {493: "check the sign: the new position is earlier than the old one",
         7: "rotate by the difference of positions, not to the target position",
         -7: "rotate by the difference of positions, not to the target position"},
        numbers=Numbers(
            {"old": (500, range(100, 4001, 10)), "new": (7, range(1, 64))},
            answer=lambda old, new: new - old,
            wrong=(lambda old, new: old - new, lambda new: new, lambda new: -new),
            text=lambda old, new: (
                f"A cached key was rotated for position {old} and must now sit at position {new}. By how many "
                "positions must it be rotated? (a signed number: positive moves it later)"))),
    Key("03.q_gpt2", "c",
        "where does GPT-2 add the position to a token's representation?",
        {"a": "the course caches GPT-2's keys and values like any other model's",
         "b": "a dozen slots fit easily in 1024 positions: the range is not the problem",
         "d": "whether a model has sinks says nothing about where positions enter it"},
        choices=("GPT-2 keeps no KV cache: it recomputes the past",
         "its 1024 learned positions are too few for a cache",
         "its positions are added at the input, inside every K and V",
         "GPT-2 has no attention sinks that could be kept")),
    Key("03.q_stream_bytes", 8388608,
        "a StreamingLLM cache stops growing once its sinks and window are full",
        {819200000: "the cache stops growing once it is full",
         8355840: "the sinks take slots too",
         32768: "the window takes slots too"},
        numbers=Numbers(
            {"bytes_per_token": (8192, [2048, 4096, 8192, 16384, 36864, 49152]), "sinks": (4, [1, 2, 4, 8]),
             "window": (1020, [252, 508, 1020, 2044, 4092]),
             "tokens": (100_000, [50_000, 100_000, 200_000, 500_000, 1_000_000])},
            answer=lambda bytes_per_token, sinks, window, tokens: bytes_per_token * min(tokens, sinks + window),
            wrong=(lambda bytes_per_token, tokens: bytes_per_token * tokens,
                   lambda bytes_per_token, window: bytes_per_token * window,
                   lambda bytes_per_token, sinks: bytes_per_token * sinks),
            text=lambda bytes_per_token, sinks, window, tokens: (
                f"A model takes {bytes_per_token} bytes per token in its cache. StreamingLLM with {sinks} sinks and a "
                f"window of {window} has read {_spaced(tokens)} tokens. How many bytes does its cache hold? "
                "(a number)"))),
    # ------------------------------------------------------------------ 04 · H2O
    Key("04.q_raw_sums", "a",
        "the bias appears even if every query spreads its attention uniformly: count the terms of each sum",
        {"b": "the bias appears even if every key has the same norm: count the terms of each sum",
         "c": "the bias appears with any position encoding, none included: count the terms of each sum",
         "d": "the softmax has no preference for early positions: count the terms of each sum"}),
    Key("04.q_queries_per_key", 8,
        "causal attention: a query sees its own key and every earlier one",
        {7: "a token attends to itself too",
         3: "causal attention: later queries see earlier keys, not the reverse",
         2: "causal attention: later queries see earlier keys, not the reverse",
         10: "the queries before position 2 cannot see it"},
        numbers=Numbers(
            {"tokens": (10, range(6, 65)), "position": (2, range(1, 63))},
            answer=lambda tokens, position: tokens - position,
            wrong=(lambda answer: answer - 1, lambda position: position + 1, lambda position: position,
                   (lambda tokens: tokens, lambda position: f"the queries before position {position} cannot see it")),
            valid=lambda tokens, position: position <= tokens - 3,
            text=lambda tokens, position: (
                f"In a prompt of T = {tokens} tokens (positions 0–{tokens - 1}) with causal attention, how many "
                f"queries attend to the key at position {position}, its own query included? (a number)"))),
    Key("04.q_uniform_mass", 0.1,
        "uniform attention gives every key the same weight",
        {10: "give a share of the attention mass, a number between 0 and 1",
         1: "with uniform weights every key holds the same share, the top ones included"}, tol=1e-3,
        numbers=Numbers(
            {"keys": (100, [40, 50, 100, 200, 400, 500, 1000]), "top_percent": (10, [5, 10, 20, 25, 40])},
            answer=lambda top_percent: top_percent / 100,
            wrong=(lambda top_percent: top_percent, lambda: 1),
            valid=lambda keys, top_percent: keys * top_percent % 100 == 0,
            text=lambda keys, top_percent: (
                f"A head attends uniformly to {keys} keys. What share of its attention do the top {top_percent} % of "
                "keys hold? (a number between 0 and 1; compare with what section 1 measured)"))),
    Key("04.q_gqa_group", 3,
        "the query heads that share a KV head form its group; the group decides together",
        {9: "only the query heads of one group share a KV head",
         1: "a KV head's keys serve several query heads: all of them count"},
        numbers=Numbers(
            {"query_heads": (9, [4, 6, 8, 9, 12, 15, 16, 24, 32]), "kv_heads": (3, [2, 3, 4, 8])},
            answer=lambda query_heads, kv_heads: query_heads / kv_heads,
            wrong=(lambda query_heads: query_heads, lambda: 1),
            valid=lambda query_heads, kv_heads: query_heads % kv_heads == 0 and query_heads > kv_heads,
            text=lambda query_heads, kv_heads: (
                f"A model has {query_heads} query heads and {kv_heads} KV heads. H2O keeps one set of tokens per KV "
                "head: how many query heads' attention is averaged into each KV head's scores? (a number)"))),
    # ------------------------------------------------------------------ 05 · SnapKV
    Key("05.q_question_at_end", "b",
        "who votes in SnapKV, and what do they attend to?",
        {"a": "the observation window (the prompt's end) is always kept",
         "c": "with the full cache a question at the start is read fine; what changes is who votes",
         "d": "SnapKV keeps the best-voted prefix positions wherever they are"},
        choices=("the question must be the first thing evicted",
         "its last queries vote, so they ask what the question needs",
         "the model cannot read a question at the start",
         "SnapKV always evicts the start of the prompt")),
    Key("05.q_prefix_kept", 48,
        "the capacity is all the slots a KV head keeps, the observation window included",
        {64: "the observation window is always kept and counts towards the capacity",
         80: "the observation window is part of the capacity, not added to it",
         16: "that is the observation window; how many other positions fit in the capacity?"},
        numbers=Numbers(
            {"capacity": (64, [32, 48, 64, 128, 256, 512, 1024]), "window": (16, [4, 8, 16, 24, 32, 64])},
            answer=lambda capacity, window: capacity - window,
            wrong=(lambda capacity: capacity, lambda capacity, window: capacity + window, lambda window: window),
            valid=lambda capacity, window: window < capacity,
            text=lambda capacity, window: (
                f"SnapKV with capacity {capacity} and an observation window of {window}: how many positions *before* "
                "the window does each KV head keep? (a number)"))),
    Key("05.q_pooling", "d",
        "pooling runs along the positions: what does it do to the neighbours of a strongly voted token?",
        {"a": "pooling runs along positions; it does not normalise anything",
         "b": "averaging the query heads of a GQA group is a separate step",
         "c": "pooling adds work; it is there for what it keeps"},
        choices=("to make every head's votes sum to one",
         "to average the query heads of a GQA group",
         "to make the compression step run faster",
         "so that a voted token's neighbours survive with it")),
    Key("05.q_vote_rows", 32,
        "every query of the window votes, in every query head that shares the KV head",
        {8: "the other query heads of the group vote too",
         4: "every query of the observation window votes, not only the last",
         12: "the votes of the group's query heads are combined across every query of the window: multiply"},
        numbers=Numbers(
            {"window": (8, [4, 8, 16, 24, 32, 64]), "group": (4, [2, 3, 4, 5, 6, 7, 8])},
            answer=lambda window, group: window * group,
            wrong=(lambda window: window, lambda group: group, lambda window, group: window + group),
            text=lambda window, group: (
                f"An observation window of {window} queries, and {group} query heads share each KV head. How many rows "
                "of attention weights (one per query and query head) contribute to one KV head's votes? "
                "(a number)"))),
    # ------------------------------------------------------------------ 06 · training a sink token
    Key("06.q_sink_logit", "a",
        "what does a head do when no key is relevant, and what does the extra slot give it instead?",
        {"b": "positions are untouched: the sink logit adds a term to the softmax's denominator",
         "c": "the empty slot has no value vector: it contributes nothing to the output",
         "d": "the causal mask still decides which keys a query may see"}),
    Key("06.q_sink_weight", 1 / 3,
        "w_j = exp(s_j) / (exp(b) + sum_i exp(s_i))",
        {0.5: "the empty slot takes part in the normalisation: exp(b) joins the denominator",
         0.25: "count the terms of the denominator again: one per real key plus the empty slot"}, tol=1e-3,
        numbers=Numbers(
            {"keys": (2, [2, 3, 4, 5, 6, 7])},
            answer=lambda keys: 1 / (keys + 1),
            wrong=(lambda keys: 1 / keys, lambda keys: 1 / (keys + 2)),
            text=lambda keys: (
                f"A head has {_WORDS[keys]} keys with scores {_zeros(keys)} and a sink logit b = 0. What weight does "
                f"each of the {_WORDS[keys]} keys get? (a number)"))),
    Key("06.q_targets", 10,
        "every content token is a target; the sink is not",
        {11: "the sink is never a target",
         9: "the first content token counts as well: the sink's position predicts it"},
        numbers=Numbers(
            {"tokens": (10, range(8, 129))},
            answer=lambda tokens: tokens,
            wrong=(lambda tokens: tokens + 1, lambda tokens: tokens - 1),
            text=lambda tokens: (
                f"A sample of T = {tokens} content tokens gets the sink token in front ({tokens + 1} inputs). How many "
                "prediction targets does `lm_loss` count in it? (a number)"))),
    Key("06.q_off_by_one", 0,
        "the extra term of the denominator is exp(b): which b makes it 1?",
        {1: "the extra term is exp(b): exp(1) is not 1",
         -1: "the extra term is exp(b): exp(-1) is not 1"}),
    # ------------------------------------------------------------------ 07 · choosing a policy
    Key("07.q_one_at_a_time", "a",
        "what happens between two tokens fed in the same forward call?",
        {"b": "several tokens in one call attend to each other before the policy can evict anything",
         "c": "positions are the same either way",
         "d": "a policy evicts one slot per new token, never the whole context at once"},
        choices=("skip the evictions between the continuation's tokens",
         "give exactly the same numbers, just faster",
         "run the model past the positions it was trained on",
         "evict the whole context before the first token is read")),
    Key("07.q_memory_ratio", 16,
        "the cache's bytes are proportional to the slots it keeps",
        {0.0625: "give the factor by which it is smaller (a number greater than 1)",
         1: "the budgeted cache keeps fewer slots than the full one"},
        numbers=Numbers(
            {"context": (4096, [1024, 2048, 4096, 8192, 16384, 32768]), "budget": (256, [64, 128, 256, 512, 1024])},
            answer=lambda context, budget: context / budget,
            wrong=(lambda context, budget: budget / context, lambda: 1),
            valid=lambda context, budget: context > budget,
            text=lambda context, budget: (
                f"A model reads a {context}-token context. A policy keeps a budget of {budget} slots per KV head. By "
                "what factor is its cache smaller than the full cache? (a number)"))),
    Key("07.q_recall", "a",
        "which policy chooses what to keep with the help of the prompt's end?",
        {"b": "StreamingLLM keeps its few sinks and the recent tokens: a fact further in is evicted",
         "c": "a window keeps the recent tokens only",
         "d": "one of these policies chooses what to keep with the question's own attention"},
        choices=("SnapKV, whose votes come from the prompt's end",
         "StreamingLLM, with its sinks and recent tokens",
         "a sliding window over the most recent tokens",
         "none of them: every one evicts that far back")),
    Key("07.q_heavy_slots", 20,
        "a budget counts every slot of a KV head: sinks, recent tokens and heavy hitters",
        {24: "the pinned sinks count against the budget too",
         28: "the recent slots count against the budget too",
         32: "the sinks and the recent slots come out of the budget"},
        numbers=Numbers(
            {"budget": (32, [32, 48, 64, 96, 128, 256]), "sinks": (4, [1, 2, 4, 8]), "recent": (8, [8, 16, 32, 64])},
            answer=lambda budget, sinks, recent: budget - sinks - recent,
            wrong=(lambda budget, recent: budget - recent, lambda budget, sinks: budget - sinks,
                   lambda budget: budget),
            valid=lambda budget, sinks, recent: budget - sinks - recent >= 4,
            text=lambda budget, sinks, recent: (
                f"An H2O-style budget of {budget} slots per KV head pins {sinks} sinks and reserves {recent} slots for "
                "the most recent tokens. How many slots remain for heavy hitters? (a number)"))),
    # ------------------------------------------------------------------ 08 · quantize, evict, or both
    Key("08.q_bytes_per_token", 4320,
        "per layer and KV head: the codes of 2 x 64 numbers, plus the scales and zero points of the key groups "
        "(per channel, shared by 32 tokens) and of the value groups (per token)",
        {2880: "the scales and zero points are stored too: 16 bits each, per group",
         23040: "that is the 16-bit cache: count 2 bits per number",
         3600: "the keys' scales count too: 64 channels x 2 numbers x 2 bytes, shared by the 32 tokens of a group",
         5760: "a scale and a zero point are 16 bits (2 bytes) each"},
        numbers=Numbers(
            {"model": ("SmolLM2-135M", ["A model"]), "layers": (30, [12, 16, 24, 28, 30, 32, 40]),
             "kv_heads": (3, [1, 2, 3, 4, 8]), "head_dim": (64, [64, 128]), "bits": (2, [2, 4]),
             "group": (32, [32, 64])},
            # per layer and KV head: a key's and a value's codes; a key group's scale and zero point per channel,
            # shared by its tokens; a token's value groups' scale and zero point (16 bits, 2 bytes, each)
            answer=lambda layers, kv_heads, head_dim, bits, group: layers * kv_heads * (
                2 * head_dim * bits / 8 + head_dim * 2 * 2 / group + head_dim / group * 2 * 2),
            wrong=(lambda layers, kv_heads, head_dim, bits: layers * kv_heads * 2 * head_dim * bits / 8,
                   (lambda layers, kv_heads, head_dim: layers * kv_heads * 2 * head_dim * 2,
                    lambda bits: f"that is the 16-bit cache: count {bits} bits per number"),
                   (lambda layers, kv_heads, head_dim, bits, group: layers * kv_heads * (
                       2 * head_dim * bits / 8 + head_dim / group * 2 * 2),
                    lambda head_dim, group: f"the keys' scales count too: {head_dim} channels x 2 numbers x 2 bytes, "
                                            f"shared by the {group} tokens of a group"),
                   lambda layers, kv_heads, head_dim, bits, group: layers * kv_heads * (
                       2 * head_dim * bits / 8 + head_dim * 2 * 4 / group + head_dim / group * 2 * 4)),
            nudge=lambda head_dim, group: (
                f"per layer and KV head: the codes of 2 x {head_dim} numbers, plus the scales and zero points of the "
                f"key groups (per channel, shared by {group} tokens) and of the value groups (per token)"),
            text=lambda model, layers, kv_heads, head_dim, bits, group: (
                f"{model} has {layers} layers, {kv_heads} KV heads and {head_dim} channels per head. In the long run "
                "(the residual aside), how\nmany bytes does one token cost in a KIVI store at "
                f"{bits} bits with groups of {group}, its scales and zero points at 16 bits?\n(a number)"))),
    Key("08.q_full_tokens", 40,
        "in the course's store a key group and its values are rounded together, once all its 32 tokens are older "
        "than the newest 32: which groups is that, before token 1,000 (counting from 0) arrives?",
        {32: "that is the residual alone: in the course's store the tokens of the key group not yet full stay in "
             "full precision too",
         8: "that is the count of KIVI's own code for the keys (it rounds its key residual 32 at a time); the question "
            "asks about the course's store, which rounds a group and its values once all its tokens are older than "
            "the newest 32",
         0: "the newest tokens are never rounded: that is the residual"},
        numbers=Numbers(
            {"group": (32, [16, 32, 64]), "residual": (32, [16, 32, 64, 128]), "tokens": (1000, range(300, 5001, 20))},
            # the course's rule (course.quantize.KIVI): a key group is rounded, with its values, once all its tokens
            # are older than the residual: the first (tokens - residual) // group groups, before the token at
            # position ``tokens`` arrives
            answer=lambda group, residual, tokens: tokens - group * ((tokens - residual) // group),
            wrong=((lambda residual: residual,
                    lambda residual: "that is the residual alone: in the course's store the tokens of the key group "
                                     "not yet full stay in full precision too"),
                   (lambda residual, tokens: tokens % residual,
                    lambda residual: f"that is the count of KIVI's own code for the keys (it rounds its key residual "
                                     f"{residual} at a time); the question asks about the course's store, which "
                                     "rounds a group and its values once all its tokens are older than the newest "
                                     f"{residual}"),
                   lambda: 0),
            valid=lambda group, residual, tokens: tokens > residual + group,
            nudge=lambda group, residual, tokens: (
                f"in the course's store a key group and its values are rounded together, once all its {group} tokens "
                f"are older than the newest {residual}: which groups is that, before token {tokens:,} (counting from "
                "0) arrives?"),
            text=lambda group, residual, tokens: (
                "The course's store (`course.quantize.KIVI`, the rule of section 2: a key group and its values "
                "rounded once\nall its tokens are older than the newest `residual`) with groups of "
                f"{group} tokens and a residual of {residual}, no token kept\nexact, has been fed tokens 0 to "
                f"{tokens - 1}. Token {tokens:,} arrives: how many tokens does the store hold in full precision as\n"
                "it arrives? (a number)"))),
    Key("08.q_sinks_exact", "a",
        "what does a group's per-channel scale do to a key unlike the others, and who reads the sink's key?",
        {"b": "the first tokens are the ones StreamingLLM never evicts",
         "c": "an exact token takes 16 bits per number, more than a rounded one",
         "d": "the sink's value is small: a drain, not the answer (notebook 02)"},
        choices=("it differs from its group, and every query leans on it",
                 "the first tokens are the ones evicted first",
                 "a token kept exact takes fewer bytes",
                 "the sink's value vector carries the answer")),
    # ------------------------------------------------------------------ 09 · retrieval heads
    Key("09.q_duo_slots", 140288,
        "the whole KV heads hold the prompt's every token; every other KV head of every layer holds its sinks and "
        "its window",
        {128000: "the streaming heads hold slots too: their sinks and their window",
         144384: "the whole heads are counted among the layers x KV heads: only the others stream",
         139520: "a streaming head keeps its sinks as well as its window"},
        numbers=Numbers(
            {"layers": (32, [24, 28, 32, 40]), "kv_heads": (8, [4, 8]), "whole": (64, [16, 32, 48, 64]),
             "sinks": (4, [4, 16, 64]), "window": (60, [60, 124, 252]), "prompt": (2000, [2000, 4000, 8000])},
            answer=lambda layers, kv_heads, whole, sinks, window, prompt: whole * prompt + (
                layers * kv_heads - whole) * (sinks + window),
            wrong=(lambda whole, prompt: whole * prompt,
                   lambda layers, kv_heads, whole, sinks, window, prompt: whole * prompt + layers * kv_heads * (
                       sinks + window),
                   lambda layers, kv_heads, whole, window, prompt: whole * prompt + (layers * kv_heads - whole) * window),
            valid=lambda layers, kv_heads, whole, sinks, window, prompt: (
                whole < layers * kv_heads and sinks + window < prompt),
            text=lambda layers, kv_heads, whole, sinks, window, prompt: (
                f"A model has {layers} layers and {kv_heads} KV heads. A DuoAttention cache keeps {whole} of its KV "
                f"heads whole and gives every\nother KV head {sinks} sinks and a window of {window}. After a prompt "
                f"of {prompt:,} tokens, how many slots does it hold in all?\n(a number)"))),
    Key("09.q_shared_slots", 96,
        "the layer keeps kv_heads x budget slots in all; each head first keeps int(budget x safeguard) of its own",
        {128: "every head first keeps its safeguard: only the rest is shared",
         120: "the safeguard is per head: every one of the KV heads keeps int(budget x safeguard)",
         24: "that is the slots per head: the common ranking shares the whole layer's remainder"},
        numbers=Numbers(
            {"kv_heads": (4, [2, 4, 8]), "budget": (32, [16, 32, 64, 128]), "safeguard": (0.25, [0.125, 0.25, 0.5])},
            answer=lambda kv_heads, budget, safeguard: kv_heads * budget - kv_heads * int(budget * safeguard),
            wrong=(lambda kv_heads, budget: kv_heads * budget,
                   lambda kv_heads, budget, safeguard: kv_heads * budget - int(budget * safeguard),
                   lambda kv_heads, budget, safeguard: budget - int(budget * safeguard)),
            text=lambda kv_heads, budget, safeguard: (
                f"Ada-KV shares one layer's budget over its {kv_heads} KV heads, {budget} slots per head on average, "
                f"with a safeguard of\n{safeguard}. How many of the layer's slots are given out by the common "
                "ranking, after every head has kept its\nsafeguard? (a number)"))),
    Key("09.q_random_control", "c",
        "what would the control measure if one of its heads were a retrieval head?",
        {"a": "masking any head costs the same: one multiplication by zero",
         "b": "the best heads may sit in any layers; the layers are not what is compared",
         "d": "the map of section 1 shows the best heads in several layers"},
        choices=("because masking a random head is cheaper to compute",
                 "so that both conditions mask heads in the same layers",
                 "so that the control never masks a retrieval head by chance",
                 "because the best 8 heads all sit in one single layer")),
]
