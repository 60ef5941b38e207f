"""Graded exercises: every checker's hints, ``check``, the student release and the autograder. The solutions come
from the solution notebooks (``tests.solutions``): the package holds none."""

from __future__ import annotations

import inspect
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

import course.exercises  # noqa: F401  (registers every exercise)
from course.__main__ import main
from course.exercises import REGISTRY, ExerciseFailed, NotDoneYet, check, nb01, nb02, nb05, nb07
from course.exercises.fixtures import exam
from course.exercises.core import AUTOFILL_ENV, _judge, result_of
from course.exercises.serve import SOCKET_ENV
from course.instructor.grading.grade import grade
from course.instructor.grading.submissions import find_submissions
from course.instructor.release import BANNER_ID, ReleaseError, check_release, release
from course.models.llama import rope
from tests.instructor.grading_helpers import submission as _submission
from tests.solutions import solution
from tests.exercises.test_policy_exercises import WRONG_POLICIES  # the policy exercises' wrong versions, tested there

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


# ----------------------------------------------------------------------------- wrong implementations
def _scores_unscaled(q, k_new, v_new, K, V):
    K, V = torch.cat([K, k_new[None]]), torch.cat([V, v_new[None]])
    return torch.softmax(K @ q, 0) @ V, K, V


def _values_not_appended(q, k_new, v_new, K, V):
    K = torch.cat([K, k_new[None]])
    return torch.softmax(K @ q / math.sqrt(q.shape[-1]), 0) @ torch.cat([V, v_new[None]]), K, V


def _greedy_recompute(model, prompt, n_new):
    ids = prompt
    with torch.inference_mode():
        for _ in range(n_new):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _greedy(model, prompt, n_new, steps_short: int = 0, fresh_cache: bool = False):
    cache = model.new_cache(batch=1)
    with torch.inference_mode():
        logits, ids = model(prompt, cache=cache).logits, prompt
        for _ in range(n_new - steps_short):
            next_id = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
            logits = model(next_id, cache=model.new_cache(batch=1) if fresh_cache else cache).logits
    return ids


def _kept_without_current(t, window, n_sink):
    return sorted(set(range(min(n_sink, t + 1))) | set(range(max(0, t - window + 1), t)))


def _victim_ignoring_sinks(scores, positions, seen, recent, n_sink=0):
    return int(scores.masked_fill(positions >= seen - recent, math.inf).argmin())


def _loss_without_first_target(logits, inputs, n_prefix):
    preds, targets = logits[:, n_prefix:-1], inputs[:, n_prefix + 1:]
    return F.cross_entropy(preds.reshape(-1, preds.shape[-1]), targets.reshape(-1))


def _softmax_keeping_sink_column(scores, sink_logit):
    extra = sink_logit[:, None, None].expand(*scores.shape[:2], 1)
    return torch.softmax(torch.cat([scores, extra], dim=-1), dim=-1)


def _continuation_ppl(model, ids, context, policy, compress=True, whole_context=False, at_once=False):
    start = context if whole_context else context - 1
    cache = model.new_cache(ids.shape[0], policy)
    with torch.inference_mode():
        model(ids[:, :start], cache=cache)
        if compress:
            cache.compress()
        if at_once:
            logits = model(ids[:, start:-1], cache=cache).logits
        else:
            logits = torch.cat([model(ids[:, t:t + 1], cache=cache).logits for t in range(start, ids.shape[1] - 1)], 1)
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, start + 1:].reshape(-1))
    return math.exp(nll.item())


def _cache_tokens(policy, budget, prompt, generated, **wrong: Callable):
    """The reference, except for the policies in ``wrong`` (name -> wrong rule of (budget, prompt, generated))."""
    if policy in wrong:
        return wrong[policy](budget, prompt, generated)
    return solution("07.cache_tokens")(policy, budget, prompt, generated)


def _best_ignoring_budget(rows, metric, max_tokens, higher_is_better):
    return (max if higher_is_better else min)(rows, key=lambda r: r[metric])["policy"]


def _always_lowest(rows, metric, max_tokens, higher_is_better):
    return min((r for r in rows if r["tokens"] <= max_tokens), key=lambda r: (r[metric], r["tokens"]))["policy"]


def _group_mean_wrong(x, kv):  # query heads h, h + kv, h + 2 kv, ... averaged (not neighbours)
    return x.reshape(x.shape[0] // kv, kv, *x.shape[1:]).mean(0)


def _attends_before_appending(q, k_new, v_new, K, V):  # the new token does not see itself
    weights = torch.softmax(K @ q / math.sqrt(q.shape[-1]), dim=0)
    out = weights @ V if len(K) else torch.zeros_like(q)
    return out, torch.cat([K, k_new[None]]), torch.cat([V, v_new[None]])


# Every registered exercise: (a realistic wrong implementation, a piece of the hint it must get).
# An exercise registered without at least two entries here fails test_every_exercise_has_wrong_versions.
WRONG: dict[str, list[tuple[Callable, str]]] = {
    "01.attention_step": [
        (_scores_unscaled, "1/sqrt(d)"),
        (_values_not_appended, "append exactly one row per step"),
        (lambda q, k_new, v_new, K, V: q, "return a tuple (output, K, V)"),
        (_attends_before_appending, "must attend to itself"),
    ],
    "01.kv_cache_bytes": [
        (lambda n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2:
         n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes, "keys AND values"),
        (lambda n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2:
         2 * n_layers * kv_heads * head_dim * tokens * dtype_bytes, "multiply by batch"),
        (lambda n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2:
         2 * kv_heads * head_dim * tokens * batch * dtype_bytes, "every layer has its own cache"),
        (lambda n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2:
         2 * n_layers * kv_heads * head_dim * tokens * batch, "multiply by dtype_bytes"),
    ],
    "01.generate_greedy": [
        (_greedy_recompute, "feed only the newest token"),
        (lambda model, prompt, n_new: _greedy(model, prompt, n_new, steps_short=1), "off by one"),
        (lambda model, prompt, n_new: _greedy(model, prompt, n_new, fresh_cache=True), "pass the same cache"),
        (lambda model, prompt, n_new: None, "return the token ids"),
    ],
    "02.sink_mass_per_head": [
        (lambda attn, k=1, skip=4: attn[:, :, :k].sum(-1).mean(-1), "leave out the first `skip` queries"),
        (lambda attn, k=1, skip=4: attn[:, skip:, :k].sum(-1).sum(-1), "average over the queries"),
        (lambda attn, k=1, skip=4: attn[:, skip:, :k].mean(-1).mean(-1), "*sum* of their weights"),
        (lambda attn, k=1, skip=4: attn[:, :k, skip:].sum(-2).mean(-1), "rows are queries"),
    ],
    "02.kept_positions": [
        (lambda t, window, n_sink: sorted(set(range(min(n_sink, t + 1))) | set(range(max(0, t - window), t + 1))),
         "one token too many"),
        (lambda t, window, n_sink: list(range(max(0, t - window + 1), t + 1)), "sink was evicted"),
        (_kept_without_current, "the current token t is in the cache too"),
        (lambda t, window, n_sink: list(range(n_sink)) + list(range(max(0, t - window + 1), t + 1)),
         "a token appears twice"),
    ],
    "02.renormalise_without": [
        (lambda weights, keep: weights * keep, "divide by the kept mass"),
        (lambda weights, keep: weights / (weights * keep).sum(-1, keepdim=True), "evicted keys must get weight 0"),
        (lambda weights, keep: torch.softmax(weights.masked_fill(~keep, -math.inf), -1), "do not apply softmax"),
    ],
    "03.cache_positions": [
        (lambda original: original, "these are the original positions"),
        (lambda original: torch.arange(len(original)), "slot order is not token order"),
        (lambda original: original.argsort(), "argsort twice"),
    ],
    "03.rerotate": [
        (lambda k_rot, old_pos, new_pos, theta=10000.0: rope(k_rot[None], new_pos[None], theta)[0],
         "rotate by the *difference*"),
        (lambda k_rot, old_pos, new_pos, theta=10000.0: rope(k_rot[None], (old_pos - new_pos)[None], theta)[0],
         "wrong direction"),
    ],
    "03.rolling_slot": [
        (lambda t, n_sink, window: t % (n_sink + window), "a sink slot was overwritten"),
        (lambda t, n_sink, window: t if t < n_sink + window else n_sink + (t - n_sink) % (window + 1),
         "slots run from 0 to n_sink + window - 1"),
        (lambda t, n_sink, window: n_sink + (t - n_sink) % window, "overwrite the *oldest* recent one"),
    ],
    "04.top_fraction_mass": [
        (lambda weights, fraction: weights[..., : max(1, math.ceil(fraction * weights.shape[-1]))].sum(-1),
         "take the *largest* weights"),
        (lambda weights, fraction: weights.topk(max(1, math.ceil(fraction * weights.shape[-1])), -1).values.mean(-1),
         "the *sum* of the top weights"),
        (lambda weights, fraction: weights.topk(int(fraction * weights.shape[-1]) + 1, -1).values.sum(-1),
         "keep ceil(fraction * S) keys"),
    ],
    "04.accumulated_scores": [
        (lambda attn, kv_heads: attn.sum(-2).reshape(kv_heads, -1, attn.shape[-1]).mean(1)
         / torch.arange(attn.shape[-1], 0, -1), "dividing by the number of queries that saw each key is the h2o-mean"),
        (lambda attn, kv_heads: attn.sum(-2), "one score per KV head"),
        (lambda attn, kv_heads: _group_mean_wrong(attn.sum(-2), kv_heads), "group neighbouring heads"),
    ],
    "04.h2o_victim": [
        (lambda scores, positions, seen, recent, n_sink=0: int(scores.argmin()), "you evicted a recent token"),
        (_victim_ignoring_sinks, "you evicted a pinned sink"),
        (lambda scores, positions, seen, recent, n_sink=0: "slot 3", "return the index of a slot"),
    ],
    "05.observation_votes": [
        (lambda attn: attn.sum(1), "leave the window's own keys"),
        (lambda attn: attn[:, :, : attn.shape[-1] - attn.shape[1]].mean(1), "sum the votes"),
        (lambda attn: attn[:, :, : attn.shape[-1] - attn.shape[1]].sum(0), "keep one row of votes per head"),
    ],
    "05.pool_votes": [
        (lambda votes, kernel, kind="max": F.max_pool1d(votes[:, None], kernel, 1, kernel // 2)[:, 0] if kind == "max"
         else F.avg_pool1d(votes[:, None], kernel, 1, kernel // 2)[:, 0], "count_include_pad=False"),
        (lambda votes, kernel, kind="max": F.max_pool1d(votes[:, None], kernel, 1)[:, 0], "must keep the shape"),
        (lambda votes, kernel, kind="max": F.max_pool1d(votes[:, None], kernel, 1, kernel // 2)[:, 0],
         "use average pooling"),
    ],
    "05.snapkv_keep": [
        (lambda votes, capacity, window, kv_heads:
         votes.reshape(kv_heads, -1, votes.shape[-1]).mean(1).topk(capacity, -1).indices, "window (positions P"),
        (lambda votes, capacity, window, kv_heads: torch.cat(
            [_group_mean_wrong(votes, kv_heads).topk(capacity - window, -1).indices,
             torch.arange(votes.shape[-1], votes.shape[-1] + window).expand(kv_heads, window)], -1),
         "average neighbouring heads"),
        (lambda votes, capacity, window, kv_heads: votes.topk(capacity, -1).indices, "expected shape"),
    ],
    "06.prepend_sink": [
        (lambda x, sink_id: torch.cat([x, torch.full_like(x[:, :1], sink_id)], 1), "in *front*"),
        (lambda x, sink_id: torch.cat([torch.full_like(x[:1], sink_id), x], 0), "add one column"),
        (lambda x, sink_id: x.index_fill(1, torch.tensor([0]), sink_id), "keep every content token"),
    ],
    "06.lm_loss": [
        (lambda logits, inputs, n_prefix: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs.reshape(-1)),
         "shift the targets by one"),
        (_loss_without_first_target, "the first content token is a target too"),
    ],
    "06.softmax_with_sink": [
        (lambda scores, sink_logit: torch.softmax(scores, -1), "add exp(sink_logit) to the denominator"),
        (_softmax_keeping_sink_column, "drop the empty slot's column"),
    ],
    "07.cache_tokens": [
        (lambda *case: _cache_tokens(*case, snapkv=lambda b, p, g: min(p + g, b)), "compresses the prompt once"),
        (lambda *case: _cache_tokens(*case, streaming=lambda b, p, g: b), "cannot hold more tokens than it has seen"),
        (lambda *case: _cache_tokens(*case, full=lambda b, p, g: p), "keeps the generated tokens too"),
    ],
    "07.compressed_perplexity": [
        (lambda *args: _continuation_ppl(*args, compress=False), "that is the full-cache perplexity"),
        (lambda *args: _continuation_ppl(*args, at_once=True), "feed one token at a time"),
        (lambda *args: _continuation_ppl(*args, whole_context=True), "*but its last token*"),
    ],
    "07.choose_policy": [
        (_best_ignoring_budget, "more than the 100 allowed"),
        (_always_lowest, "higher_is_better says which way"),
    ],
}


def test_every_exercise_has_wrong_versions():
    from tests.known_wrong import WRONG_BUILD  # the build exercises
    from tests.exercises.test_exercises_ramp import WRONG_QUESTIONS, WRONG_RAMP  # the ramp's exercises and the questions

    every = {**WRONG, **WRONG_POLICIES, **WRONG_RAMP, **WRONG_QUESTIONS, **WRONG_BUILD}
    missing = sorted(set(REGISTRY) - set(every))
    assert not missing, f"add at least two wrong implementations with their hints to WRONG for {missing}"
    assert sorted(every) == sorted(REGISTRY), f"WRONG names exercises that do not exist: {set(every) - set(REGISTRY)}"
    assert all(len(versions) >= 2 for versions in every.values())


CHECKED_LOCALLY = sorted(e for e, ex in REGISTRY.items() if ex.kind not in ("question", "writing"))


@pytest.mark.parametrize("exercise_id", CHECKED_LOCALLY)
def test_solution_passes(exercise_id):
    assert result_of(REGISTRY[exercise_id], solution(exercise_id)) == ("pass", "correct")


class _Unguarded:
    """The checkers' model without its guard: the whole forward and policies allowed, nothing counted."""

    def __init__(self, model, *args, **kwargs) -> None:
        self._model, self.calls, self.key_rows = model, [], [0]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, ids, *args, **kwargs):
        self.calls.append(int(ids.shape[-1]))
        return self._model(ids, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.mark.parametrize("exercise_id", sorted(e for e, ex in REGISTRY.items()
                                                if ex.fallback is not None and ex.kind != "writing"))
def test_autofills_fallback_is_right_and_a_shortcut_where_the_exercise_builds(exercise_id, monkeypatch):
    """AUTOFILL's stand-in passes the checker (the builds' with the model unguarded: it is the course's own
    mechanism, which the guard refuses); in the builds (and wherever it uses a listed shortcut) it is reported as
    the course's own implementation, so copying it earns nothing."""
    ex = REGISTRY[exercise_id]
    with monkeypatch.context() as unguarded:
        for module in (nb01, nb02, nb05, nb07):
            unguarded.setattr(module, "GuardedModel", _Unguarded)
        assert _judge(ex, ex.fallback, None) == ("pass", "correct", ex.points)
    status, feedback = result_of(ex, ex.fallback)
    if ex.kind == "capstone":  # measured by what it achieves: StreamingLLM's scores earn part of the points
        assert status == "pass", feedback
    else:
        assert status == "forwarded" and "the course's own implementation" in feedback, feedback


@pytest.mark.parametrize("exercise_id, index", [(e, i) for e in sorted(WRONG) for i in range(len(WRONG[e]))])
@pytest.mark.parametrize("seed", [None, 2024])
def test_wrong_version_gets_its_hint(exercise_id, index, seed):
    """On the public inputs and on a graded release's (``exam``: the checkers' inputs drawn from its seed)."""
    fn, hint = WRONG[exercise_id][index]
    with exam(seed):
        status, feedback = result_of(REGISTRY[exercise_id], fn)
    assert status == "wrong" and hint in feedback, (status, feedback)


def test_not_done_and_crashing_functions():
    ex = REGISTRY["01.kv_cache_bytes"]

    def not_done(*args, **kwargs):
        raise NotImplementedError()

    assert result_of(ex, not_done)[0] == "not_done"
    status, feedback = result_of(ex, lambda *args, **kwargs: 1 / 0)
    assert status == "error" and "ZeroDivisionError" in feedback


# ----------------------------------------------------------------------------- check()
def _not_done(*args, **kwargs):
    raise NotImplementedError()


def _no_factor_two(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):
    return n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes


@pytest.fixture
def interactive(monkeypatch):
    """``check`` as a student runs it: not grading, autofill only when asked."""
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv(AUTOFILL_ENV, raising=False)


def test_check_pass_returns_the_students_function(capsys, interactive):
    fn = solution("01.kv_cache_bytes")
    student = lambda *a, **k: fn(*a, **k)  # noqa: E731
    assert check("01.kv_cache_bytes", student, autofill=False) is student
    assert "✓" in capsys.readouterr().out


def test_check_not_done_and_autofill(capsys, monkeypatch, interactive):
    reference = REGISTRY["01.kv_cache_bytes"].fallback
    with pytest.raises(NotDoneYet, match="AUTOFILL"):
        check("01.kv_cache_bytes", _not_done, autofill=False)
    assert check("01.kv_cache_bytes", _not_done, autofill=True) is reference
    assert "⚠" in capsys.readouterr().out
    monkeypatch.setenv(AUTOFILL_ENV, "1")  # switches autofill on whatever the notebook's parameter says
    assert check("01.kv_cache_bytes", _not_done, autofill=False) is reference


def test_check_wrong_raises_with_the_hint(monkeypatch, interactive):
    monkeypatch.setenv(AUTOFILL_ENV, "1")  # autofill never hides a wrong answer
    with pytest.raises(ExerciseFailed, match="keys AND values"):
        check("01.kv_cache_bytes", _no_factor_two, autofill=True)


def test_check_in_grading_mode_carries_on_silently(capsys, monkeypatch):
    """Under the autograder (here with no grader listening) check never stops the notebook and prints
    nothing: the student's function when it passes locally, else the course's fallback."""
    monkeypatch.setenv(SOCKET_ENV, "/nonexistent/grader.sock")
    reference = REGISTRY["01.kv_cache_bytes"].fallback
    right = solution("01.kv_cache_bytes")
    student = lambda *a, **k: right(*a, **k)  # noqa: E731
    assert check("01.kv_cache_bytes", _no_factor_two, autofill=False) is reference
    assert check("01.kv_cache_bytes", _not_done, autofill=False) is reference
    assert check("01.kv_cache_bytes", student, autofill=False) is student
    assert capsys.readouterr().out == ""


# ----------------------------------------------------------------------------- release
def _code_cells_by_id(path: Path) -> dict[str, nbformat.NotebookNode]:
    return {c.id: c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"}


def _solution_regions(source: str) -> tuple[list[str], list[str]]:
    """(lines inside the solution regions, lines outside) of a solution cell."""
    inside, outside, in_region = [], [], False
    for line in source.splitlines():
        if "BEGIN SOLUTION" in line or "END SOLUTION" in line:
            in_region = "BEGIN SOLUTION" in line
        else:
            (inside if in_region else outside).append(line)
    return inside, outside


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A folder with a fresh release of every solution notebook."""
    folder = tmp_path_factory.mktemp("student")
    release(NOTEBOOKS, folder)
    return folder


def test_release_is_idempotent(released, tmp_path):
    again = release(NOTEBOOKS, tmp_path / "again")
    assert [p.name for p in again] == sorted(p.name for p in released.glob("*.ipynb"))
    for path in again:
        assert path.read_bytes() == (released / path.name).read_bytes()
    release(NOTEBOOKS, tmp_path / "again")
    assert all(p.read_bytes() == (released / p.name).read_bytes() for p in again)


def test_student_copies_have_no_solutions(released):
    for solution_path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        student_path = released / solution_path.name
        nb = nbformat.read(student_path, as_version=4)
        nbformat.validate(nb)
        sol = nbformat.read(solution_path, as_version=4)
        assert nb.cells[0].id == BANNER_ID and "python -m course release" in nb.cells[0].source
        assert [c.id for c in nb.cells[1:]] == [c.id for c in sol.cells]
        assert [c.metadata for c in nb.cells[1:]] == [c.metadata for c in sol.cells]
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)
        student_cells = _code_cells_by_id(student_path)
        exercises = 0
        for cell in sol.cells:
            student = student_cells.get(cell.id)
            if student is None:
                continue
            assert student.outputs == [] and student.execution_count is None
            assert "BEGIN SOLUTION" not in student.source and "END SOLUTION" not in student.source
            inside, outside = _solution_regions(cell.source)
            if inside:
                exercises += 1
                assert "raise NotImplementedError()" in student.source
                leaked = [ln for ln in inside if ln.strip() and ln in student.source.splitlines() and ln not in outside]
                assert not leaked, f"{solution_path.name} {cell.id}: solution lines left: {leaked}"
        assert exercises >= 1


def test_every_exercise_cell_raises_not_implemented(released):
    for path in sorted(released.glob("*.ipynb")):
        for cell in _code_cells_by_id(path).values():
            if "raise NotImplementedError()" not in cell.source:
                continue
            namespace = {"torch": torch, "math": math, "F": F}
            before = set(namespace)
            exec(cell.source, namespace)
            functions = [v for k, v in namespace.items() if k not in before and inspect.isfunction(v)
                         and v.__module__ is None]  # defined by the cell (no __name__ here), not imported by it
            assert functions, f"{path.name} {cell.id} defines no function"
            for fn in functions:
                n_required = sum(p.default is p.empty for p in inspect.signature(fn).parameters.values())
                with pytest.raises(NotImplementedError):
                    fn(*[None] * n_required)


def test_committed_student_copies_are_up_to_date(capsys):
    assert check_release(NOTEBOOKS, NOTEBOOKS / "student") == []
    assert main(["release", "--check", "--notebooks", str(NOTEBOOKS)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_check_finds_tampered_missing_and_orphan_copies(released, tmp_path, capsys):
    copies = tmp_path / "student"
    shutil.copytree(released, copies)
    names = sorted(p.name for p in copies.glob("*.ipynb"))
    tampered = copies / names[0]
    tampered.write_text(tampered.read_text().replace("NotImplementedError", "NotImplementedError  # hint"))
    (copies / names[1]).unlink()
    shutil.copy(tampered, copies / "99_no_solution.ipynb")
    problems = {(d.path.name, d.problem) for d in check_release(NOTEBOOKS, copies)}
    assert problems == {(names[0], "differs"), (names[1], "missing"), ("99_no_solution.ipynb", "no solution notebook")}
    assert main(["release", "--check", "--notebooks", str(NOTEBOOKS), "--out", str(copies)]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in (names[0], names[1], "99_no_solution.ipynb"))
    assert main(["release", "--notebooks", str(NOTEBOOKS), "--out", str(copies)]) == 0
    assert check_release(NOTEBOOKS, copies) == []


@pytest.mark.parametrize("source, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "nested"),
    ("def f():\n    ### BEGIN SOLUTION\n    return 1", "never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION", "without a"),
])
def test_release_refuses_unbalanced_markers(tmp_path, source, message):
    src = tmp_path / "solutions"
    src.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 09", id="intro"),
                                         nbformat.v4.new_code_cell(source, id="ex")])
    nbformat.write(nb, src / "09_bad.ipynb")
    with pytest.raises(ReleaseError, match=rf"09_bad\.ipynb, cell 2 \(id ex\): .*{message}"):
        release(src, tmp_path / "student")
    assert not (tmp_path / "student" / "09_bad.ipynb").exists()


# ----------------------------------------------------------------------------- grading
def test_find_submissions(tmp_path):
    for name in ("a/01_x.ipynb", "a/.ipynb_checkpoints/01_x-checkpoint.ipynb", "b/c/02_y.ipynb", "b/notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    found = find_submissions([tmp_path, tmp_path / "a" / "01_x.ipynb"])
    assert [(s.path, s.student, s.notebook, s.problem) for s in found] == [
        (tmp_path / "a" / "01_x.ipynb", "a", "01", None), (tmp_path / "b" / "c" / "02_y.ipynb", "b", "02", None)]
    with pytest.raises(ValueError, match="does not exist"):
        find_submissions([tmp_path / "nowhere"])


NO_FACTOR_TWO = ("def kv_cache_bytes(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):\n"
                 "    return n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes\n")


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory, released, grading_key) -> dict[str, list[dict]]:
    """One grading run over several submissions of notebook 01, rows by student."""
    root = tmp_path_factory.mktemp("submissions")
    solution = NOTEBOOKS / "01_kv_cache.ipynb"
    _submission(root / "solution", solution, trim=False)
    _submission(root / "blank", released / "01_kv_cache.ipynb")
    _submission(root / "wrong", solution, {"kv_cache_bytes": NO_FACTOR_TWO},
                extra_cell="for i in range(100_000):\n    print('noise', i)")
    _submission(root / "crash", solution, {"attention_step": "import os\nos._exit(1)"})
    (root / "unreadable").mkdir()
    (root / "unreadable" / "01_kv_cache.ipynb").write_text("{ not json")
    (root / "dave").mkdir()
    (root / "dave" / "42_unknown.ipynb").write_text("{}")
    rows = grade([root], timeout=300, key=grading_key)
    by_student: dict[str, list[dict]] = {}
    for r in rows:
        by_student.setdefault(r["student"], []).append(r)
    return by_student


N_01 = sum(e.startswith("01.") for e in REGISTRY)  # notebook 01's exercises and questions: one row each
P_01 = sum(e.points for name, e in REGISTRY.items() if name.startswith("01."))  # and their points


def _by_exercise(rows: list[dict]) -> dict[str, dict]:
    return {r["exercise"]: r for r in rows}


@pytest.mark.slow  # a grading run (the gradebook fixture)
def test_solution_gets_full_marks(gradebook):
    rows = gradebook["solution"]
    assert [r["exercise"] for r in rows] == [e for e in REGISTRY if e.startswith("01.")]
    assert all(r["status"] == "pass" and r["points"] == r["max_points"] >= 1 for r in rows), rows


@pytest.mark.slow  # a grading run (the gradebook fixture)
def test_blank_copy_gets_zero(gradebook):
    rows = gradebook["blank"]
    assert len(rows) == N_01 and all(r["status"] == "not_done" and r["points"] == 0 for r in rows), rows


@pytest.mark.slow  # a grading run (the gradebook fixture)
def test_one_wrong_exercise_gets_zero_with_its_hint(gradebook):
    rows = _by_exercise(gradebook["wrong"])
    assert rows["01.kv_cache_bytes"]["points"] == 0 and rows["01.kv_cache_bytes"]["status"] == "wrong"
    assert "keys AND values" in rows["01.kv_cache_bytes"]["feedback"]
    assert rows["01.attention_step"]["points"] == rows["01.generate_greedy"]["points"] == 1


@pytest.mark.slow  # a grading run (the gradebook fixture)
def test_notebooks_that_cannot_run_still_get_rows(gradebook):
    crashed = gradebook["crash"]
    assert len(crashed) == N_01 and all(r["points"] == 0 and "kernel died" in r["feedback"] for r in crashed), crashed
    unreadable = gradebook["unreadable"]
    assert len(unreadable) == N_01 and all(r["status"] == "error" and "could not be run" in r["feedback"]
                                        for r in unreadable)
    [unknown] = gradebook["dave"]
    assert unknown["status"] == "error" and "notebook 42" in unknown["feedback"] and unknown["max_points"] == 0


@pytest.mark.slow
def test_overall_time_limit(tmp_path, grading_key):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import time\ntime.sleep(60)"),
        nbformat.v4.new_code_cell('kv_cache_bytes = check("01.kv_cache_bytes", kv_cache_bytes)'),
    ])
    nbformat.write(nb, tmp_path / "erin__01_kv_cache.ipynb")
    rows = _by_exercise(grade([tmp_path], timeout=60, total_timeout=3, layout="flat", key=grading_key))
    assert rows["01.kv_cache_bytes"]["status"] == "not_reached"
    assert "overall time limit of 3 s in cell 1 (`import time`)" in rows["01.kv_cache_bytes"]["feedback"]
    assert "no cell of the notebook checks this exercise" in rows["01.attention_step"]["feedback"]


@pytest.mark.slow
def test_endless_loop_is_cut_off(tmp_path, capsys, grading_key):
    solution = NOTEBOOKS / "01_kv_cache.ipynb"
    _submission(tmp_path / "subs" / "loop", solution, {
        "attention_step": "def attention_step(q, k_new, v_new, K, V):\n    while True:\n        pass\n",
        "generate_greedy": "def generate_greedy(model, prompt, n_new):\n    return 1 / 0\n",
    })
    out = tmp_path / "gradebook"
    assert main(["grade", str(tmp_path / "subs"), "--timeout", "20", "--out", str(out), "--key", str(grading_key)]) == 0
    assert f"total loop: {P_01 - 2}/{P_01}" in capsys.readouterr().out  # all but the looping and the raising one
    rows = _by_exercise(json.loads((out / "gradebook.json").read_text()))
    looping, raising = rows["01.attention_step"], rows["01.generate_greedy"]
    assert looping["status"] == "timeout" and "timed out after 20 s" in looping["feedback"]
    assert raising["status"] == "error" and "ZeroDivisionError" in raising["feedback"]
    assert rows["01.kv_cache_bytes"]["points"] == 1
    assert (out / "gradebook.csv").read_text().splitlines()[0].startswith("student,notebook,exercise,points")


def test_autofill_never_writes_a_conclusion():
    ex = REGISTRY["07.conclusion"]
    assert result_of(ex, ex.fallback)[0] == "wrong" and "AUTOFILL" in ex.fallback()
