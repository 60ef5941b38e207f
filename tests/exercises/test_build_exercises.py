"""The build exercises (notebooks 01 to 06): the student writes a mechanism end to end and the course's
own code is the oracle. Every checker accepts the solution notebook's version (and correct variants), rejects the
realistic wrong versions of ``tests.known_wrong`` with feedback that names the mistake and the matching hint, and
refuses the shortcuts (the course's own implementation, a recomputation where a cache is asked); the capstone (07)
is graded on held-out passages; the questions' letters are spread and their options of similar length; every
notebook has a build-sized exercise."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import torch

import course.exercises  # noqa: F401  (registers every exercise)
from course import assets
from course.exercises import REGISTRY
from course.exercises.checking import check
from course.exercises.core import Exercise, ExerciseFailed, Partial, Wrong, _judge, outcome, result_of
from course.exercises.questions import QUESTIONS
from tests.known_wrong import CASES, MISTAKES, _variant
from tests.solutions import NUMBERS, answer_key, solution

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
BUILDS = sorted(e for e, ex in REGISTRY.items() if ex.kind == "build")


def test_every_notebook_but_the_last_has_a_build_and_every_build_known_mistakes():
    assert BUILDS == sorted(MISTAKES)
    assert sorted({e[:2] for e in BUILDS}) == sorted({e[:2] for e in REGISTRY} - {"07"})


@pytest.mark.parametrize("exercise_id", BUILDS)
def test_build_solution_passes_and_the_switchboard_is_right_when_all_switches_are_off(exercise_id):
    ex = REGISTRY[exercise_id]
    assert result_of(ex, solution(exercise_id)) == ("pass", "correct")
    assert result_of(ex, _variant(MISTAKES[exercise_id][0])) == ("pass", "correct")


@pytest.mark.parametrize("exercise_id, index", CASES)
def test_build_mistake_gets_its_hint(exercise_id, index):
    impl, mistakes = MISTAKES[exercise_id]
    switches, fragment = mistakes[index]
    status, feedback = result_of(REGISTRY[exercise_id], _variant(impl, **switches))
    assert status == "wrong" and fragment in feedback, (status, feedback)
    assert re.search(r"\(see Hint [123], .*below the exercise\)$", feedback), feedback


@pytest.mark.parametrize("exercise_id", BUILDS)
def test_every_build_has_three_hints_in_its_notebook(exercise_id):
    [path] = NOTEBOOKS.glob(f"{exercise_id[:2]}_*.ipynb")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    check_cell = next(i for i, c in enumerate(cells) if f'check("{exercise_id}"' in "".join(c["source"]))
    hints = "".join(cells[check_cell - 1]["source"])
    assert cells[check_cell - 1]["cell_type"] == "markdown"
    assert [f"<b>Hint {n}</b>" in hints for n in (1, 2, 3)] == [True] * 3 and hints.count("<details>") == 3


def test_snapkv_build_accepts_float32_votes_and_other_tie_breaks():
    import torch.nn.functional as F

    def float_votes(model, prompt, capacity, window, kernel, pooling="max"):
        b, p = prompt.shape
        h, hkv = model.config.n_head, model.config.n_kv_head
        cache = model.new_cache(batch=b)
        with torch.inference_mode():
            attns = model(prompt, cache=cache, output_attentions=True).attentions
        for layer, attn in zip(cache.layers, attns):
            votes = attn[:, :, -window:, : p - window].float().sum(2).reshape(b * h, 1, -1)
            pooled = F.max_pool1d(votes, kernel, 1, kernel // 2) if pooling == "max" else \
                F.avg_pool1d(votes, kernel, 1, kernel // 2, count_include_pad=False)
            grouped = pooled.reshape(b, hkv, h // hkv, -1).mean(2).flip(-1)  # reversed: ties break the other way
            best = (p - window - 1) - grouped.topk(capacity - window, -1).indices
            keep = torch.cat([best, torch.arange(p - window, p).expand(b, hkv, window)], -1)
            layer.gather(keep.sort(-1).values)
        return cache

    assert result_of(REGISTRY["05.snapkv_compress"], float_votes) == ("pass", "correct")


def test_build_checkers_reject_what_skips_the_work():
    def calls_the_model(model, prompt, n_new):
        return model(prompt), None

    status, feedback = result_of(REGISTRY["01.greedy_own_attention"], calls_the_model)
    assert status == "error" and "write it yourself from the parts" in feedback

    def recomputes(model, ids, window, n_sink=0):
        out = []
        for t in range(ids.shape[1] - 1):
            lo = max(0, t + 1 - window - n_sink)
            ctx = torch.cat([ids[:, :n_sink], ids[:, max(lo, n_sink) : t + 1]], 1) if t + 1 > n_sink \
                else ids[:, : t + 1]
            logits = model(ctx).logits[:, -1].double()
            out.append(torch.logsumexp(logits, -1) - logits.gather(-1, ids[:, t + 1 : t + 2])[:, 0])
        return torch.stack(out, 1)

    status, feedback = result_of(REGISTRY["02.window_stream_nll"], recomputes)
    assert status == "wrong" and "one token per forward call" in feedback


def _greedy_whole_prefix(model, prompt, n_new):
    """Cached generation that hands the model the whole prefix at every step (no cache at all)."""
    ids = prompt
    with torch.inference_mode():
        for _ in range(n_new):
            ids = torch.cat([ids, model.forward(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _greedy_recomputing_keys(model, prompt, n_new):
    """The build, with every key and value recomputed from scratch at every step (the parts, no cache)."""
    from course.models.llama import rope

    cfg = model.config
    h, hkv, d = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    ids, rows = prompt, []
    for t in range(prompt.shape[1] + n_new - 1):
        x = model.tok_emb(ids[:, : t + 1])
        b, n = x.shape[:2]
        pos = torch.arange(n).expand(b, n)
        for block in model.blocks:
            z = block.norm1(x)
            q = rope(block.attn.q(z).view(b, n, h, d).transpose(1, 2), pos, cfg.rope_theta)
            k = rope(block.attn.k(z).view(b, n, hkv, d).transpose(1, 2), pos, cfg.rope_theta)
            v = block.attn.v(z).view(b, n, hkv, d).transpose(1, 2)
            k, v = (c.repeat_interleave(h // hkv, 1) for c in (k, v))
            w = torch.softmax((q @ k.transpose(-1, -2) / d**0.5).masked_fill(
                torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")), -1)
            x = x + block.attn.o((w @ v).transpose(1, 2).reshape(b, n, h * d))
            x = x + block.mlp(block.norm2(x))
        logits = model.lm_head(model.norm(x))[:, -1]
        rows.append(logits)
        if t >= prompt.shape[1] - 1:
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(rows, 1)


def _window_with_the_course_policy(model, ids, window, n_sink=0):
    from course.policies import make_policy

    cache = model.new_cache(ids.shape[0], make_policy("streaming", window + n_sink, sinks=n_sink,
                                                      positions="original"))
    nll = []
    for t in range(ids.shape[1] - 1):
        logits = model(ids[:, t : t + 1], cache=cache).logits[:, -1].double()
        nll.append(torch.logsumexp(logits, -1) - logits.gather(-1, ids[:, t + 1 : t + 2])[:, 0])
    return torch.stack(nll, 1)


def _window_policy_swapped_in(model, ids, window, n_sink=0):
    from course.policies import make_policy

    cache = model.new_cache(batch=ids.shape[0])
    cache.policy = make_policy("streaming", window + n_sink, sinks=n_sink, positions="original")
    return torch.stack([model(ids[:, t : t + 1], cache=cache).logits[:, -1, 0].double()
                        for t in range(ids.shape[1] - 1)], 1)


def _snapkv_by_the_course(model, prompt, capacity, window, kernel, pooling="max"):
    from course.compression import compress_prompt
    from course.policies import SnapKV

    return compress_prompt(model, prompt, SnapKV(capacity, window, kernel, pooling))[0]


def _snapkv_votes_by_the_course(model, prompt, capacity, window, kernel, pooling="max"):
    """Takes only the votes from the course's SnapKV, through a plain cache, and keeps the best itself."""
    from course.policies import SnapKV

    cache = model.new_cache(batch=prompt.shape[0])
    out = model(prompt, cache=cache, output_attentions=True)
    policy = SnapKV(capacity, window, kernel, pooling)
    for layer, attn in zip(cache.layers, out.attentions):
        policy.observe(layer, attn[:, :, -window:], seen=prompt.shape[1])
        layer.gather(layer.stat("snapkv").topk(capacity, -1).indices.sort(-1).values)
    return cache


# (exercise, a build that hands the work to the course or skips it, a fragment of the feedback the grader's own
# process gives it: the model's guard or the count of keys projected, which a kernel cannot switch off)
SHORTCUTS = [
    ("01.generate_greedy", _greedy_whole_prefix, "after the prompt, feed only the newest token"),
    ("01.greedy_own_attention", _greedy_recomputing_keys, "projected 45 keys per layer for 9 tokens"),
    ("02.window_stream_nll", _window_with_the_course_policy, "runs the course's own policy"),
    ("02.window_stream_nll", _window_policy_swapped_in, "the cache's policy was changed"),
    ("05.snapkv_compress", _snapkv_by_the_course, "runs the course's own policy"),
    ("05.snapkv_compress", _snapkv_votes_by_the_course, "course.policies.SnapKV"),
]


@pytest.mark.parametrize("exercise_id, fn, fragment", SHORTCUTS, ids=[f"{e}-{f.__name__}" for e, f, _ in SHORTCUTS])
def test_a_build_that_hands_the_work_back_to_the_course_is_refused(exercise_id, fn, fragment):
    """Refused twice over: by the watch for the course's own implementations (the kernel's side under the grader)
    and, with that watch off, by what the checker measures in its own process."""
    ex = REGISTRY[exercise_id]
    status, feedback = result_of(ex, fn)
    assert status in ("wrong", "error", "forwarded"), (status, feedback)
    status, feedback, points = _judge(ex, fn, None)  # no watch: what a kernel that switched it off would give
    if "SnapKV" in fragment:  # only the votes were taken: the kept slots are right, the watch is what sees it
        assert result_of(ex, fn)[0] == "forwarded" and fragment in result_of(ex, fn)[1]
        return
    assert status in ("wrong", "error") and points == 0 and fragment in feedback, (status, feedback)


# ----------------------------------------------------------------------------- reference sizes, from the notebooks
def _reference_lines(source: str) -> int:
    """Non-blank, non-comment lines between ### BEGIN SOLUTION and ### END SOLUTION."""
    inside, n = False, 0
    for line in source.splitlines():
        s = line.strip()
        if s.startswith("### BEGIN SOLUTION"):
            inside = True
        elif s.startswith("### END SOLUTION"):
            inside = False
        elif inside and s and not s.startswith("#"):
            n += 1
    return n


def reference_sizes() -> dict[str, dict[str, int]]:
    """{notebook number: {exercise id: reference lines}} over the solution notebooks' exercises (not questions)."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
        for i, src in enumerate(cells[:-1]):
            if "### BEGIN SOLUTION" not in src:
                continue
            ids = re.findall(r'check\("(\d\d\.\w+)"', "\n".join(cells[i + 1 : i + 3]))
            if ids and ".q_" not in ids[0]:
                out.setdefault(path.name[:2], {})[ids[0]] = _reference_lines(src)
    return out


def test_every_notebook_has_a_build_sized_exercise_and_the_median_is_not_one_line():
    sizes = reference_sizes()
    print({nb: dict(sorted(s.items(), key=lambda kv: -kv[1])) for nb, s in sizes.items()})
    assert sorted(sizes) == NUMBERS, sorted(sizes)
    for nb in sizes:
        assert max(sizes[nb].values()) >= 12, (nb, sizes[nb])
    everything = [n for s in sizes.values() for n in s.values()]
    print(f"median reference: {statistics.median(everything)} lines")
    assert statistics.median(everything) >= 4, sorted(everything)


# ----------------------------------------------------------------------------- questions
def test_more_computed_answers_than_letters_and_letters_spread():
    choice = [q for q in QUESTIONS if q.kind == "choice"]
    assert len(QUESTIONS) - len(choice) > len(choice)
    counts = {letter: sum(answer_key()[q.id].answer == letter for q in choice) for letter in "abcd"}
    assert max(counts.values()) <= 0.4 * len(choice), counts


@pytest.mark.parametrize("key", [k for k in answer_key().values() if k.choices], ids=lambda k: k.id)
def test_options_are_four_of_similar_length_and_printed_in_the_notebook(key):
    lengths = [len(c) for c in key.choices]
    assert len(lengths) == 4 and max(lengths) <= 1.5 * min(lengths), (key.id, lengths)
    [path] = NOTEBOOKS.glob(f"{key.id[:2]}_*.ipynb")
    text = path.read_text(encoding="utf-8")
    printed = "  ".join(f"({letter}) {c}" for letter, c in zip("abcd", key.choices))
    assert json.dumps(printed, ensure_ascii=False)[1:-1] in text, key.id


def test_mc_questions_of_the_build_notebooks_all_list_their_options():
    for q in QUESTIONS:
        if q.kind == "choice" and q.id[:2] in ("01", "02", "03", "05", "07"):
            assert len(answer_key()[q.id].choices) == 4, q.id


def test_hidden_answers_say_only_whether_an_answer_is_well_formed(capsys):
    from course.exercises.questions import encode_key

    q = next(q for q in QUESTIONS if q.kind == "choice")
    right = answer_key()[q.id].answer
    wrong = next(letter for letter in "abcd" if letter != right)
    for answer in (right, wrong):
        check(q.id, lambda a=answer: a, answers="hidden")
        assert "the grader decides" in capsys.readouterr().out
    with pytest.raises(ExerciseFailed, match="one letter"):
        check(q.id, lambda: "z", answers="hidden")
    key = encode_key(answer_key()[q.id].entry())
    with pytest.raises(ExerciseFailed):  # self-study with the key release wrote: the immediate verdict
        check(q.id, lambda: wrong, key=key)
    check(q.id, lambda: right, key=key)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(ExerciseFailed):  # a hidden copy ignores a key even if one is pasted in
        check(q.id, lambda: "z", answers="hidden", key=key)


def test_release_writes_each_questions_key_or_hides_it():
    from course.exercises.questions import decode_key
    from course.instructor.release import hide_answers

    entries = {"01.q_exact": answer_key()["01.q_exact"].entry()}
    assert hide_answers('q1 = check("01.q_exact", q1, autofill=AUTOFILL)') == \
        'q1 = check("01.q_exact", q1, autofill=AUTOFILL, answers="hidden")'
    shown = hide_answers('q1 = check("01.q_exact", q1, autofill=AUTOFILL)', entries)
    namespace: dict = {}
    exec(shown.replace("q1 = check(", "captured = dict(id=").replace("q1, autofill=AUTOFILL,", ""), namespace)
    assert decode_key(namespace["captured"]["key"]) == entries["01.q_exact"]
    same = 'rolling_step = check("03.rolling_step", rolling_step, autofill=AUTOFILL)'
    assert hide_answers(same) == same == hide_answers(same, entries)


# ----------------------------------------------------------------------------- the capstone on held-out passages
def _window_scores(positions, attention, seen, budget):
    return positions.float()


def _streaming_scores(positions, attention, seen, budget):  # StreamingLLM written as a score function
    return torch.where(positions < 4, torch.inf, positions.float())


def _random_scores(positions, attention, seen, budget):  # a random priority per token, fixed once drawn
    table = torch.rand(int(positions.max()) + 1, generator=torch.Generator().manual_seed(0))
    return table[positions]


@pytest.mark.slow
@pytest.mark.skipif(not assets.status()["smollm2-135m"], reason="SmolLM2-135M is not in the course cache")
def test_capstone_grade_depends_on_measured_quality(grading_key):
    """On the key's held-out passages: the solution's policy full marks, StreamingLLM as a score function partial
    (it is the baseline), a plain window and random eviction nothing; the feedback gives n and the interval."""
    from course.instructor.grading.key import measures, read_key

    measure = measures(read_key(grading_key))["07.my_policy"]
    ex = REGISTRY["07.my_policy"]
    results = {name: outcome(ex, fn, measure) for name, fn in (
        ("solution", solution("07.my_policy")), ("streaming", _streaming_scores), ("window", _window_scores),
        ("random", _random_scores))}
    print({name: (status, points, feedback[-160:]) for name, (status, feedback, points) in results.items()})
    assert all("n = 24" in feedback and "interval over passages" in feedback for _, feedback, _ in results.values())
    assert results["solution"][0] == "pass" and results["solution"][2] == ex.points
    assert results["streaming"][0] == "partial" and 0 < results["streaming"][2] < ex.points
    assert results["window"][:3:2] == ("wrong", 0) and results["random"][:3:2] == ("wrong", 0)


def test_a_grader_measurement_can_give_part_of_the_points():
    def half(fn):
        raise Partial("beats the window, not StreamingLLM", 1)

    def refuse(fn):
        raise Wrong("does not beat the window")

    ex = Exercise("99.x", "x", lambda fn: None, points=2)
    assert outcome(ex, lambda: 0) == ("pass", "correct", 2)  # the notebook's check: no measurement
    assert outcome(ex, lambda: 0, half) == ("partial", "beats the window, not StreamingLLM", 1)
    assert outcome(ex, lambda: 0, refuse) == ("wrong", "does not beat the window", 0)
    assert outcome(ex, lambda: 0, lambda fn: "39.45 < 44.35") == ("pass", "correct; 39.45 < 44.35", 2)


def test_notebook_07_states_the_capstones_measurement_as_the_grader_makes_it():
    from course.instructor.grading.capstone import SETTINGS
    from course.instructor.release import CAPSTONE_PASSAGES

    [path] = NOTEBOOKS.glob("07_*.ipynb")
    text = " ".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                    if "".join(c["source"]).startswith("## 8 · Capstone"))
    text = " ".join(text.split())
    s = SETTINGS
    for fact in (f"{CAPSTONE_PASSAGES} passages", f"**{s.budget} slots per KV head**", f"{s.context} tokens of context",
                 f"{s.continuation} scored", f"{s.sinks} sinks + {s.budget - s.sinks} recent",
                 f"{s.level:.0%}".replace("%", " %"), "half of them"):
        assert fact in text, fact
    assert REGISTRY["07.my_policy"].points == 2 * s.partial
