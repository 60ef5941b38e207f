"""Check your understanding: short questions per notebook, answered by a function that returns the answer.

A question is an exercise like any other (same registry, same ``check``, same grader): the student
writes a function of no arguments that returns the answer, a letter for a multiple-choice question
or a number, and ``check("02.q_first_eviction", answer, autofill=AUTOFILL)`` checks it. Under the
grader only the returned value crosses (plain data). A wrong answer gets a hint that names the
misconception, never the answer. The questions' text is in the notebooks; here are the answers.

The questions are about concepts and arithmetic that hold for every model of the course (GPT-2 and
SmolLM2 alike), never about one model's measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from course.exercises.core import Wrong, exercise

__all__ = ["Question", "QUESTIONS", "normalise_choice", "check_form"]

CHOICES = "abcde"


@dataclass(frozen=True)
class Question:
    """One checked question.

    answer: a letter (multiple choice among ``options``) or a number (``tol``: relative tolerance).
    hints: wrong answer -> what is wrong with it; nudge: the hint for any other wrong answer.
    """

    id: str  # "<notebook>.q_<name>"
    title: str
    answer: str | float
    nudge: str
    hints: dict = field(default_factory=dict)
    options: str = "abcd"
    tol: float = 1e-9
    choices: tuple[str, ...] = ()  # the options' text, as the notebook prints them: "(a) ...  (b) ..."

    def __post_init__(self) -> None:
        if self.choices:
            object.__setattr__(self, "options", CHOICES[: len(self.choices)])

    @property
    def is_choice(self) -> bool:
        return isinstance(self.answer, str)


def normalise_choice(value: object) -> str | None:
    """'b', 'B', ' (b) ', 'b)' -> 'b'; anything that is not one letter -> None."""
    if not isinstance(value, str):
        return None
    letter = value.strip().strip("()").strip().rstrip(")").strip().lower()
    return letter if len(letter) == 1 and letter in CHOICES else None


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:  # a 0-d tensor or numpy number
        import torch

        t = torch.as_tensor(value)
        return float(t) if t.dim() == 0 and t.dtype != torch.bool else None
    except (TypeError, ValueError, RuntimeError):
        return None


def _same(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _form_problem(q: Question, got: object) -> str | None:
    """Why ``got`` is not a well-formed answer to ``q`` (None when it is: a letter among the options, or a
    number)."""
    if q.is_choice:
        letter = normalise_choice(got)
        if letter is None or letter not in q.options:
            return f"answer with one letter among {', '.join(q.options)} (a string such as \"a\"), got {got!r}"
        return None
    number = _as_number(got)
    return f"answer with a number, got {got!r}" if number is None or math.isnan(number) else None


def check_form(id: str, fn: Callable) -> None:
    """The check of a question when the answers are hidden (``release --hide-answers``): raises ``Wrong`` only
    for an answer that is not well-formed; whether it is right is the grader's to say."""
    q = next((q for q in QUESTIONS if q.id == id), None)
    if q is None:
        raise KeyError(f"{id!r} is not a question")
    problem = _form_problem(q, fn())
    if problem:
        raise Wrong(problem)


def _checker(q: Question) -> Callable[[Callable], None]:
    def check_answer(fn: Callable) -> None:
        got = fn()
        problem = _form_problem(q, got)
        if problem:
            raise Wrong(problem)
        if q.is_choice:
            letter = normalise_choice(got)
            if letter != q.answer:
                raise Wrong(q.hints.get(letter, q.nudge))
            return
        number = _as_number(got)
        if _same(number, float(q.answer), q.tol):
            return
        hint = next((h for wrong, h in q.hints.items() if _same(number, float(wrong), q.tol)), q.nudge)
        raise Wrong(hint)

    return check_answer


def _reference(answer: str | float) -> Callable[[], str | float]:
    def answer_fn() -> str | float:
        return answer

    return answer_fn


def _register(q: Question) -> None:
    if q.is_choice and (len(q.answer) != 1 or q.answer not in q.options):
        raise ValueError(f"{q.id}: the answer must be one of the options {q.options!r}, got {q.answer!r}")
    exercise(q.id, q.title, _reference(q.answer), points=1)(_checker(q))


_SINK_HINT = "a head's attention must go somewhere: think of what happens to the share the first token received"

QUESTIONS: list[Question] = [
    # ------------------------------------------------------------------ 01 · the KV cache
    Question("01.q_bytes_per_token", "Question 1 (bytes per token)", 36864,
             "multiply: keys and values, layers, KV heads, head size, bytes per number",
             {18432: "check both factors of 2: a key AND a value per head, and 2 bytes per float16 number",
              73728: "float16 numbers take 2 bytes each, not 4",
              3072: "every layer stores its own keys and values: multiply by the number of layers"}),
    Question("01.q_gqa_factor", "Question 2 (what GQA saves)", 4,
             "the cache holds one key and one value per KV head: compare the numbers of KV heads",
             {8: "the factor is how many query heads share one KV head",
              32: "the factor is how many query heads share one KV head",
              0.25: "give the factor by which it is smaller (a number greater than 1)"}),
    Question("01.q_what_grows", "Question 3 (what grows with the context)", "b",
             "compare what one cached step computes for the new token with what it reads from the cache",
             {"a": "the weight matrices process one new token per step, whatever the context length",
              "c": "the weight matrices process one new token per step, whatever the context length",
              "d": "the new token's query is compared with every cached key"},
             choices=("the products of the new token with the weight matrices",
              "the attention of the new query over the cached keys and values",
              "both the weight products and the attention over the cache",
              "neither: a cached step costs the same at every context length")),
    Question("01.q_exact", "Question 4 (what the cache changes)", "c",
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
    Question("02.q_first_eviction", "Question 1 (when the collapse starts)", 64,
             "the window holds positions t - W + 1 .. t: find the first t at which that range no longer starts at 0",
             {63: "at t = 63 the cache holds positions 0..63, exactly W tokens: nothing has been evicted yet",
              65: "one step late: the window holds the W positions t - W + 1 .. t, the new token included",
              0: "token 0 is evicted only once the cache is full"}),
    Question("02.q_why_collapse", "Question 2 (why evicting the first token hurts)", "d",
             _SINK_HINT,
             {"a": "replacing the first tokens by newlines costs little: their content is not what matters",
              "b": "a window keeps original positions, all of them already seen in training before the collapse",
              "c": "once full, the cache no longer grows"},
             choices=("the first token carries the most important content of the text",
              "the positions of the remaining tokens exceed those seen in training",
              "the cache runs out of memory once the first token is evicted",
              "heads that parked their attention on token 0 must spread it elsewhere")),
    Question("02.q_renormalise", "Question 3 (where the sink's share goes)", 0.25,
             "after an eviction the softmax renormalises: the remaining weights sum to 1 again",
             {0.1: "the softmax renormalises: the remaining weights must sum to 1",
              0.4: "that is their old total; after renormalising they sum to 1: give one token's weight",
              0.15: "the share is not added equally: renormalising divides by the remaining total"}, tol=1e-3),
    Question("02.q_newlines", "Question 4 (what makes a sink)", "c",
             "what did the newline tokens have in common with the tokens they replaced?",
             {"a": "a newline carries almost no content",
              "b": "the number of sinks is a different experiment",
              "d": "nothing is re-read: evicted tokens are gone from the cache"},
             choices=("newline tokens are more informative than the words they replace",
              "four sink tokens are always needed, whatever the model",
              "the sink role comes from being first, not from what the token says",
              "the model re-reads the evicted text through the newline tokens")),
    # ------------------------------------------------------------------ 03 · StreamingLLM
    Question("03.q_positions_seen", "Question 1 (positions inside the cache)", "b",
             "re-assigning numbers the cached tokens by their rank inside the cache",
             {"a": "those are the stream positions, what positions='original' uses",
              "c": "the sinks are among the cached tokens, and they are the oldest",
              "d": "the sinks are re-numbered together with the window"},
             choices=("their stream positions, 0–3 and 993–1000",
              "0–11, their ranks inside the cache",
              "989–1000, the last twelve stream positions",
              "0–3 for the sinks and 993–1000 for the window")),
    Question("03.q_what_changes", "Question 2 (what re-assigning changes)", "d",
             "the cache keeps the same tokens either way; ask which positions the model gets to see",
             {"a": "a cached key is the same vector; only the rotation applied to it changes",
              "b": "which tokens stay is the policy's choice; positions say where the model believes they are",
              "c": "RoPE rotates every query and key by an angle proportional to its position"},
             choices=("the contents of the cached key and value vectors",
              "which tokens the cache keeps and which it evicts",
              "nothing at all, as long as the model uses RoPE",
              "its positions never exceed the cache size")),
    Question("03.q_rerotate", "Question 3 (re-rotating a key)", -493,
             "rotations add up: rotate by the difference between the new and the old position",
             {493: "check the sign: the new position is earlier than the old one",
              7: "rotate by the difference of positions, not to the target position",
              -7: "rotate by the difference of positions, not to the target position"}),
    Question("03.q_gpt2", "Question 4 (why GPT-2 cannot re-assign)", "c",
             "where does GPT-2 add the position to a token's representation?",
             {"a": "the course caches GPT-2's keys and values like any other model's",
              "b": "a dozen slots fit easily in 1024 positions: the range is not the problem",
              "d": "whether a model has sinks says nothing about where positions enter it"},
             choices=("GPT-2 keeps no KV cache: it recomputes the past",
              "its 1024 learned positions are too few for a cache",
              "its positions are added at the input, inside every K and V",
              "GPT-2 has no attention sinks that could be kept")),
    Question("03.q_stream_bytes", "Question 5 (memory after a long stream)", 8388608,
             "a StreamingLLM cache stops growing once its sinks and window are full",
             {819200000: "the cache stops growing once it is full",
              8355840: "the sinks take slots too",
              32768: "the window takes slots too"}),
    # ------------------------------------------------------------------ 04 · H2O
    Question("04.q_raw_sums", "Question 1 (why raw sums favour old tokens)", "a",
             "the bias appears even if every query spreads its attention uniformly: count the terms of each sum",
             {"b": "the bias appears even if every key has the same norm: count the terms of each sum",
              "c": "the bias appears with any position encoding, none included: count the terms of each sum",
              "d": "the softmax has no preference for early positions: count the terms of each sum"}),
    Question("04.q_queries_per_key", "Question 2 (how many queries see a key)", 8,
             "causal attention: a query sees its own key and every earlier one",
             {7: "a token attends to itself too",
              3: "causal attention: later queries see earlier keys, not the reverse",
              2: "causal attention: later queries see earlier keys, not the reverse",
              10: "the queries before position 2 cannot see it"}),
    Question("04.q_uniform_mass", "Question 3 (what sparse means)", 0.1,
             "uniform attention gives every key the same weight",
             {10: "give a share of the attention mass, a number between 0 and 1",
              1: "with uniform weights every key holds the same share, the top ones included"}, tol=1e-3),
    Question("04.q_gqa_group", "Question 4 (scores per KV head)", 3,
             "the query heads that share a KV head form its group; the group decides together",
             {9: "only the query heads of one group share a KV head",
              1: "a KV head's keys serve several query heads: all of them count"}),
    # ------------------------------------------------------------------ 05 · SnapKV
    Question("05.q_question_at_end", "Question 1 (why the question goes last)", "b",
             "who votes in SnapKV, and what do they attend to?",
             {"a": "the observation window (the prompt's end) is always kept",
              "c": "with the full cache a question at the start is read fine; what changes is who votes",
              "d": "SnapKV keeps the best-voted prefix positions wherever they are"},
             choices=("the question must be the first thing evicted",
              "its last queries vote, so they ask what the question needs",
              "the model cannot read a question at the start",
              "SnapKV always evicts the start of the prompt")),
    Question("05.q_prefix_kept", "Question 2 (capacity bookkeeping)", 48,
             "the capacity is all the slots a KV head keeps, the observation window included",
             {64: "the observation window is always kept and counts towards the capacity",
              80: "the observation window is part of the capacity, not added to it",
              16: "that is the observation window; how many other positions fit in the capacity?"}),
    Question("05.q_pooling", "Question 3 (why pool the votes)", "d",
             "pooling runs along the positions: what does it do to the neighbours of a strongly voted token?",
             {"a": "pooling runs along positions; it does not normalise anything",
              "b": "averaging the query heads of a GQA group is a separate step",
              "c": "pooling adds work; it is there for what it keeps"},
             choices=("to make every head's votes sum to one",
              "to average the query heads of a GQA group",
              "to make the compression step run faster",
              "so that a voted token's neighbours survive with it")),
    Question("05.q_vote_rows", "Question 4 (who votes for a KV head)", 32,
             "every query of the window votes, in every query head that shares the KV head",
             {8: "the other query heads of the group vote too",
              4: "every query of the observation window votes, not only the last",
              12: "the votes of the group's query heads are combined across every query of the window: multiply"}),
    # ------------------------------------------------------------------ 06 · training a sink token
    Question("06.q_sink_logit", "Question 1 (what a sink logit replaces)", "a",
             "what does a head do when no key is relevant, and what does the extra slot give it instead?",
             {"b": "positions are untouched: the sink logit adds a term to the softmax's denominator",
              "c": "the empty slot has no value vector: it contributes nothing to the output",
              "d": "the causal mask still decides which keys a query may see"}),
    Question("06.q_sink_weight", "Question 2 (a softmax with a sink)", 1 / 3,
             "w_j = exp(s_j) / (exp(b) + sum_i exp(s_i))",
             {0.5: "the empty slot takes part in the normalisation: exp(b) joins the denominator",
              0.25: "count the terms of the denominator again: one per real key plus the empty slot"}, tol=1e-3),
    Question("06.q_targets", "Question 3 (what the loss counts)", 10,
             "every content token is a target; the sink is not",
             {11: "the sink is never a target",
              9: "the first content token is a target too: it is predicted from the sink's position"}),
    Question("06.q_off_by_one", "Question 4 (the off-by-one softmax)", 0,
             "the extra term of the denominator is exp(b): which b makes it 1?",
             {1: "the extra term is exp(b): exp(1) is not 1",
              -1: "the extra term is exp(b): exp(-1) is not 1"}),
    # ------------------------------------------------------------------ 07 · choosing a policy
    Question("07.q_one_at_a_time", "Question 1 (why one token at a time)", "a",
             "what happens between two tokens fed in the same forward call?",
             {"b": "several tokens in one call attend to each other before the policy can evict anything",
              "c": "positions are the same either way",
              "d": "a policy evicts one slot per new token, never the whole context at once"},
             choices=("skip the evictions between the continuation's tokens",
              "give exactly the same numbers, just faster",
              "run the model past the positions it was trained on",
              "evict the whole context before the first token is read")),
    Question("07.q_memory_ratio", "Question 2 (memory saved)", 16,
             "the cache's bytes are proportional to the slots it keeps",
             {0.0625: "give the factor by which it is smaller (a number greater than 1)",
              1: "the budgeted cache keeps fewer slots than the full one"}),
    Question("07.q_recall", "Question 3 (which policy can recall)", "a",
             "which policy chooses what to keep with the help of the prompt's end?",
             {"b": "StreamingLLM keeps its few sinks and the recent tokens: a fact further in is evicted",
              "c": "a window keeps the recent tokens only",
              "d": "one of these policies chooses what to keep with the question's own attention"},
             choices=("SnapKV, whose votes come from the prompt's end",
              "StreamingLLM, with its sinks and recent tokens",
              "a sliding window over the most recent tokens",
              "none of them: every one evicts that far back")),
    Question("07.q_heavy_slots", "Question 4 (a budget's share)", 20,
             "a budget counts every slot of a KV head: sinks, recent tokens and heavy hitters",
             {24: "the pinned sinks count against the budget too",
              28: "the recent slots count against the budget too",
              32: "the sinks and the recent slots come out of the budget"}),
]

for _q in QUESTIONS:
    _register(_q)
