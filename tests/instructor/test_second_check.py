"""The second check (``course.instructor.grading.stripped``): a function that hands its work back to the course is
refused where the course's implementation is absent, whatever the student's kernel did to its own watch; an
exercise left undone is never held against the ones after it; an honest function passes.

Each check here is one real second check: a stripped copy of the package, a fresh bubblewrap sandbox, the
student's definitions replayed, the exercise's checker run in this process (about 1.5 s each)."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

import course.exercises  # noqa: F401  (registers every exercise)
from course.exercises.core import REGISTRY
from course.instructor.grading.isolation import find_isolation
from course.instructor.grading.remote import CheckResult
from course.instructor.grading.sandbox import Limits
from course.instructor.grading.stripped import check_call, notebook_definitions, second_checks, strip_course
from course.instructor.solutions import paste_solutions

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NUMBERS = sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
BUILDS = sorted(e.id for e in REGISTRY.values() if e.kind == "build")
HEADER = "import torch\nfrom course.exercises import check\nAUTOFILL = False\n"


@pytest.fixture(scope="module")
def isolation():
    return find_isolation()


def _recheck(nb: nbformat.NotebookNode, exercise_id: str, isolation, undone: tuple[str, ...] = ()) -> CheckResult:
    """The second check of ``exercise_id``, the kernel having passed it (and not passed ``undone``)."""
    exercises = [e for e in REGISTRY.values() if e.id == exercise_id or e.id in undone]
    kernel = {e.id: CheckResult("not_done" if e.id in undone else "pass", "", 0) for e in exercises}
    return second_checks(nb, exercises, kernel, isolation=isolation, time_limit=120, limits=Limits(),
                         extra_env={"COURSE_FAST": "1"}, measures={})[exercise_id]


def _honest(number: str) -> nbformat.NotebookNode:
    [solution] = NOTEBOOKS.glob(f"{number}_*.ipynb")
    return paste_solutions(nbformat.read(NOTEBOOKS / "student" / solution.name, as_version=4),
                           nbformat.read(solution, as_version=4))


def _handing_back(exercise_id: str, body: str) -> nbformat.NotebookNode:
    """A notebook whose function for ``exercise_id`` is ``body`` (which defines it under its notebook name)."""
    [number] = {exercise_id[:2]}
    _, alias, name = check_call(_honest(number), exercise_id)
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(HEADER), nbformat.v4.new_code_cell(body.format(name=name)),
        nbformat.v4.new_code_cell(f'{alias} = check("{exercise_id}", {name}, autofill=AUTOFILL)')])


@pytest.mark.parametrize("exercise_id", BUILDS)
def test_a_build_handed_back_to_the_course_is_refused_where_the_course_is_absent(exercise_id, isolation):
    """The build is the course's own stand-in for it (the function AUTOFILL hands a student), imported under the
    student's name: no watch runs in the second check, the stand-in's insides are simply not there."""
    fallback = REGISTRY[exercise_id].fallback
    body = f"from {fallback.__module__} import {fallback.__name__} as {{name}}\n"
    result = _recheck(_handing_back(exercise_id, body), exercise_id, isolation)
    assert result.status == "forwarded", result


ROUTES = {  # routes to the course that a switched-off (or blind) watch in the kernel lets through
    "06.sink_attention_layer": "from course.models.attend import attend\n"
                               "def {name}(x, layer):\n"
                               "    b, t, dm = x.shape\n"
                               "    h = layer.n_head\n"
                               "    heads = layer.qkv(x).split(dm, dim=-1)\n"
                               "    q, k, v = (z.view(b, t, h, dm // h).transpose(1, 2) for z in heads)\n"
                               "    out, _ = attend(q, k, v, causal=True, sink_logit=layer.sink_logit)\n"
                               "    return layer.out(out.transpose(1, 2).reshape(b, t, dm))\n",
    "08.kivi_settle": "from course.quantize import KIVI\n"  # the private helpers of the course's KIVI
                      "def {name}(keys, values, positions, done, next_position, bits, group, residual):\n"
                      "    q = KIVI(bits=bits, group=group, residual=residual)\n"
                      "    while done + group <= next_position - residual:\n"
                      "        member = (positions >= done) & (positions < done + group)\n"
                      "        if bool(member.any()):\n"
                      "            inside = member[..., None]\n"
                      "            keys = torch.where(inside, q._per_channel(keys, inside), keys)\n"
                      "            values = torch.where(inside, q._per_token(values), values)\n"
                      "        done += group\n"
                      "    return keys, values, done\n",
    "08.round_values": "import inspect, course.quantize\n"  # copies of the course's source, not calls into it
                       "def {name}(v, bits, group):\n"
                       "    space = dict(vars(inspect.getmodule(course.quantize.quantize)))\n"
                       "    for f in ('quantize', 'dequantize', 'fake_quantize'):\n"
                       "        exec(inspect.getsource(getattr(course.quantize, f)), space)\n"
                       "    shape = v.shape\n"
                       "    grouped = v.reshape(*shape[:-1], shape[-1] // group, group)\n"
                       "    return space['fake_quantize'](grouped, bits, dim=-1).reshape(shape)\n",
}


def _defined(exercise_id: str) -> object:
    """The route's function, defined in this process (where the course is whole)."""
    space: dict = {}
    exec(HEADER + ROUTES[exercise_id].format(name="fn"), space)
    return space["fn"]


@pytest.mark.parametrize("exercise_id", sorted(ROUTES))
def test_other_routes_to_the_course_are_refused(exercise_id, isolation):
    """A sink layer through the course's attention, KIVI's private helpers, ``inspect.getsource`` copies of the
    course's rounding: each passes the checker where the course is whole and nothing watches (the control), and is
    refused in the second check, where the source itself says the function is absent."""
    REGISTRY[exercise_id].checker(_defined(exercise_id))  # raises if the route were not a working answer
    result = _recheck(_handing_back(exercise_id, ROUTES[exercise_id]), exercise_id, isolation)
    assert result.status == "forwarded" and result.points == 0, result


def test_the_stripped_package_keeps_no_copy_of_a_shortcut():
    ex = REGISTRY["08.kivi_settle"]
    text = (strip_course(ex) / "storage" / "kivi.py").read_text(encoding="utf-8")
    tree = ast.parse(text)
    settle = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "settle")
    assert len(settle.body) == 1 and isinstance(settle.body[0], ast.Raise)
    assert "_per_channel" in text and "round(" not in ast.unparse(settle)


def _undone(nb: nbformat.NotebookNode, exercise_id: str) -> nbformat.NotebookNode:
    """``nb`` with the cell that defines ``exercise_id``'s function as the student copy hands it out."""
    [solution] = NOTEBOOKS.glob(f"{exercise_id[:2]}_*.ipynb")
    blank = nbformat.read(NOTEBOOKS / "student" / solution.name, as_version=4)
    cell, _, name = check_call(nb, exercise_id)
    index = max(i for i in range(cell) if f"def {name}(" in nb.cells[i].source)
    undone = nbformat.from_dict(nb)
    undone.cells[index] = blank.cells[index]
    assert "NotImplementedError" in undone.cells[index].source
    return undone


@pytest.mark.parametrize("number", NUMBERS)
def test_an_exercise_left_undone_costs_no_other_exercise(number, isolation):
    """Each exercise left undone in turn: an exercise after it can only be affected through the undone function's
    name (the second check defines it from the student's cells, where the undone one raises NotImplementedError);
    every later exercise that uses that name is checked for real with the grader's stand-in, every other one is
    shown not to use it."""
    nb = _honest(number)
    exercises = [e for e in REGISTRY.values() if e.id.startswith(f"{number}.") and e.kind != "question"]
    calls = {e.id: check_call(nb, e.id) for e in exercises}
    checked = 0
    for skipped in exercises:
        if calls[skipped.id] is None:
            continue
        alias = calls[skipped.id][1]
        for later in exercises:
            if not later.shortcuts or calls[later.id] is None or calls[later.id][0] <= calls[skipped.id][0]:
                continue
            source = "\n".join(notebook_definitions(nb, calls[later.id][0]))
            if alias not in {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}:
                continue  # never reaches the undone function: nothing to hold against it
            result = _recheck(_undone(nb, skipped.id), later.id, isolation, undone=(skipped.id,))
            assert result.status == "pass" and result.points == later.points, (skipped.id, later.id, result)
            checked += 1
    assert checked == {"05": 4, "06": 3, "08": 2}.get(number, 0)


def test_an_honest_build_passes_the_second_check(isolation):
    result = _recheck(_honest("08"), "08.kivi_settle", isolation)
    assert result == CheckResult("pass", "correct", REGISTRY["08.kivi_settle"].points)


def test_a_global_the_notebook_computed_goes_to_review_not_to_zero(isolation):
    """A correct function that reads a global made by a call (not defined again in the second check) is put up for
    review, with the name in the feedback; the same function forwarding is still refused."""
    body = ("FACTOR = int('2')\n"
            "def {name}(n_layers, kv_heads, head_dim, tokens, batch=1, dtype_bytes=2):\n"
            "    return FACTOR * n_layers * kv_heads * head_dim * tokens * batch * dtype_bytes\n")
    result = _recheck(_handing_back("01.kv_cache_bytes", body), "01.kv_cache_bytes", isolation)
    assert result.status == "review" and "FACTOR" in result.feedback and result.points == 0, result
