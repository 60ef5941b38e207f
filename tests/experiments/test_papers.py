"""Published numbers: every number a notebook's prose quotes from a paper is in course.papers, and the reproduction
rows, their verdict rules and the page that lists them behave as documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course.claims import REPRODUCTIONS, Rule, reproduction, show_reproductions
from course.papers import PAPERS, RESULTS, numbers_in, quoted_numbers, value

from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# A sentence (or table row) quotes a paper when it names one of these.
CITES = re.compile(r"et al\.|arXiv|\bTable \d|\bFigure \d|\bpaper\b|paper's|\breplication\b|\bMiller\b")
# What is not a quoted result: code, formulas, links, arXiv IDs, years, section and table numbers, model names.
NOT_RESULTS = [
    r"`[^`]*`", r"\$[^$]*\$", r"\]\([^)]*\)", r"\d{4}\.\d{4,5}", r"\b(?:19|20)\d\d\b",
    r"(?:Table|Figure|Appendix|§|section|notebook|Notebook|sections?|Exercise)\s*[\dA-Z][\d.]*",
    r"[≥≤]\s*\d[\d.]*",                                 # the course's own thresholds: "≥ 0.05 nats"
    r"(?<=\))\s*=\s*\d[\d.]*",                           # derived from quoted numbers: "ln(27.87/18.05) = 0.43"
    r"\b[\w.]*[A-Za-z][\w.]*-[\w.-]*\d[\w.-]*",          # Llama-2-13B, GPT-2, SmolLM2-135M, PG-19 (not 0+1024)
    r"\b\d+[MBK]\b",                                     # 160M parameters, 400K tokens
    r"(?<![\d.])0\d\b",                                   # notebook numbers: 02, 04
    r"^\s*(?:#+\s*)?\d+[.·]?",                             # list items and section headings: "3.", "## 5 ·"
]


def units(markdown: str) -> list[str]:
    """Sentences of prose and rows of tables: the unit a citation covers."""
    out = []
    for block in re.split(r"\n\s*\n", markdown):
        if block.lstrip().startswith("|"):
            out += block.splitlines()
        else:
            for item in re.split(r"\n(?=\s*(?:\d+\.|[*-])\s)", block):   # list items apart
                out += re.split(r"(?<=[.;:])\s+(?=[A-Z*(])", item.replace("\n", " "))
    return out


def unquoted_numbers(markdown: str) -> list[tuple[float, str]]:
    """The numbers in the citing units of ``markdown`` that course.papers does not hold."""
    held = quoted_numbers()
    missing = []
    for unit in units(markdown):
        if not CITES.search(unit):
            continue
        text = unit
        for pattern in NOT_RESULTS:
            text = re.sub(pattern, " ", text)
        missing += [(n, unit.strip()) for n in sorted(numbers_in(text)) if n not in held]
    return missing


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_a_notebook_quotes_from_a_paper_is_in_the_table(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    missing = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            missing += [(i, n, unit) for n, unit in unquoted_numbers("".join(cell["source"]))]
    assert not missing, "numbers quoted beside a paper but not in course/papers.py:\n" + "\n".join(
        f"  cell {i}: {n:g} in: {unit}" for i, n, unit in missing)


def test_the_check_catches_a_number_the_table_does_not_hold():
    assert unquoted_numbers("Xiao et al. report 5158.07 with the window (Table 1).") == []
    wrong = unquoted_numbers("Xiao et al. report 5185.07 with the window (Table 1, arXiv 2309.17453).")
    assert [n for n, _ in wrong] == [5185.07]
    assert unquoted_numbers("Our window gives 5185.07 here.") == []          # no paper named: the course's own
    assert [n for n, _ in unquoted_numbers("| Table 2 | Llama-2-7B | 3359.95 | 12.34 |")] == [12.34]


def test_every_notebook_links_the_references_from_its_first_cell():
    for path in NOTEBOOKS:
        first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        assert "](../docs/references.md" in first, f"{path.name}: the first cell does not link docs/references.md"
    refs = (ROOT / "docs" / "references.md").read_text(encoding="utf-8")
    for paper in PAPERS.values():
        assert (paper.arxiv or paper.url or paper.short).lower() in refs.lower(), paper.key


def test_the_table_of_results_names_a_known_paper_and_a_place_for_every_result():
    for key, r in RESULTS.items():
        assert r.paper in PAPERS and r.where and r.setting, key
    assert value("streamingllm.table2.llama2", "4") == 9.59
    with pytest.raises(KeyError, match="has no value '16'"):
        value("streamingllm.table2.llama2", "16")
    with pytest.raises(KeyError, match="no paper result"):
        value("nowhere", "4")
    assert numbers_in("20 480 tokens, 5,641 and 3.6x") == {20480, 5641, 3.6}


def test_a_rule_gives_the_verdict_fixed_before_the_run():
    up = Rule("window only / sinks", at_least=10, partly=2)   # one value: judged on itself
    assert [up.verdict(x)[0] for x in (12, 10, 3, 1.5)] == ["reproduced", "reproduced", "partly",
                                                            "not reproduced at this scale"]
    down = Rule("sinks / dense", at_most=1.1, partly=1.5)
    assert [down.verdict(x)[0] for x in (1.0, 1.3, 2.0)] == ["reproduced", "partly", "not reproduced at this scale"]
    assert "1.3: <= 1.5 but > 1.1" in down.verdict(1.3)[1]
    with pytest.raises(ValueError, match="exactly one of"):
        Rule("x", at_least=1, at_most=2)
    with pytest.raises(ValueError, match="looser"):
        Rule("x", at_least=10, partly=20)


def test_a_reproduction_is_recorded_capped_and_shown(capsys):
    before = len(REPRODUCTIONS)
    trained, untrained = tiny_config("gpt2"), tiny_config("gpt2", random_weights=True, name="gpt2-random")
    rule = Rule("no sinks / 4 sinks", at_least=10, partly=2, why="a collapse")
    values = [40.0, 35.0, 38.0, 45.0, 50.0]
    row = reproduction("99", "streamingllm.table2.llama2", "350x", values, rule, trained, "5 passages")
    assert row.verdict == "reproduced" and row.source.endswith("arXiv 2309.17453), Table 2")
    assert (row.n, row.low, row.high, row.interval) == (5, 35.0, 50.0, "range")
    few = reproduction("99", "streamingllm.table2.llama2", "350x", values[:2], rule, trained, "2 passages")
    assert few.verdict == "inconclusive at n = 2" and "a verdict needs 5 values" in few.reason
    capped = reproduction("99", "streamingllm.table2.llama2", "350x", values, rule, untrained, "5 passages",
                          limit="the stream is shorter than the trained context")
    assert capped.verdict == "partly" and "shorter than the trained context" in capped.reason
    assert "random weights" in capped.reason
    assert len(REPRODUCTIONS) == before + 1  # the same row recorded again replaces the first
    rows = show_reproductions("99")
    assert rows == [capped] and "Verdict: partly" in capsys.readouterr().out
    with pytest.raises(KeyError):
        reproduction("99", "no.such.result", "1", 1.0, rule, trained, "")
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if r.notebook != "99"]


def _executed(tmp_path, name, rows, fast):
    from dataclasses import asdict

    from course.claims import REPRODUCTION_MIME

    nb = {"cells": [{"cell_type": "code", "source": "show_reproductions('03')", "metadata": {}, "outputs": [
        {"output_type": "display_data", "metadata": {},
         "data": {"text/plain": "...", REPRODUCTION_MIME: {"notebook": "03", "rows": [asdict(r) for r in rows]}}}]}],
          "metadata": {"papermill": {"parameters": {"MODEL": "smollm2-135m", "FAST": fast}}}, "nbformat": 4,
          "nbformat_minor": 5}
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / name).write_text(json.dumps(nb), encoding="utf-8")


def test_the_page_is_written_from_executed_notebooks(tmp_path):
    from course.claims import illustration
    from course.instructor.reproductions import write_reproductions

    rule = Rule("no sinks / 4 sinks", at_least=10, partly=2)
    row = reproduction("03", "streamingllm.table2.llama2", "3359.95 / 9.59 = 350x", [3.0, 2.5, 4.0, 3.5, 2.8], rule,
                       tiny_config("gpt2"), "4 passages of 320 tokens")
    shown = illustration("03", "streamingllm.table7", "0.00", 0.0, "recall beyond the cache", tiny_config("gpt2"),
                         "2 passkeys", why="true by construction")
    full = reproduction("03", "streamingllm.table2.llama2", "3359.95 / 9.59 = 350x", [12, 14, 30, 11, 13], rule,
                        tiny_config("gpt2"), "8 passages of 1024 tokens")
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if r.notebook != "03"]
    _executed(tmp_path / "fast", "03_streaming_llm.ipynb", [row, shown], True)
    _executed(tmp_path / "full", "03_streaming_llm.ipynb", [full], False)
    (tmp_path / "full" / "not-run.txt").write_text("04_h2o: 23 minutes on two cores\n", encoding="utf-8")
    result = write_reproductions([tmp_path / "fast", tmp_path / "full"], tmp_path / "docs" / "reproductions.md")
    page = (tmp_path / "docs" / "reproductions.md").read_text(encoding="utf-8")
    assert result["columns"]["FAST"]["partly"] == 1 and result["columns"]["full size"]["reproduced"] == 1
    assert "| 03 | Xiao et al. (2023, arXiv 2309.17453), Table 2 | no sinks / 4 sinks | 3359.95 / 9.59 = 350x | " \
           "3 [2.5 to 4, range], n = 5" in page and "**partly**" in page and "MODEL = 'smollm2-135m'" in page
    assert "FAST: 1 reproductions — 0 reproduced, 1 partly" in page       # the illustration is not counted
    assert "## Illustrations (shown, not counted)" in page and "true by construction" in page
    assert "Where FAST and full size disagree" in page and "FAST *partly*, full size *reproduced*" in page
    assert "`04_h2o` not run: 23 minutes on two cores" in page
    assert "**FAST** (the quick mode" in page and "**full size** (the sizes the notebooks are written for" in page
    assert "Quoted, not re-run" in page and "Table 3" in page  # results no notebook re-ran are still listed
    with pytest.raises(ValueError, match="two folders give the column"):
        write_reproductions([tmp_path / "fast", tmp_path / "fast"], tmp_path / "x.md")
    (tmp_path / "fast" / "03_streaming_llm.ipynb").unlink()
    with pytest.raises(ValueError, match="no executed notebook holds reproduction rows"):
        write_reproductions(tmp_path / "fast", tmp_path / "x.md")


def test_the_committed_page_has_both_columns_the_three_kinds_and_n_everywhere():
    """docs/reproductions.md as committed: FAST and full-size columns, the three kinds apart, every row with its n,
    every reproduction of two values or more with its interval."""
    page = (ROOT / "docs" / "reproductions.md").read_text(encoding="utf-8")
    sections = ["## Reproductions (counted)", "## Illustrations (shown, not counted)",
                "## The course's own findings (no paper)", "## The rules"]
    assert [page.index(s) for s in sections] == sorted(page.index(s) for s in sections)
    assert "| FAST: course | FAST: verdict | full size: course | full size: verdict |" in page
    reps = page[page.index(sections[0]):page.index(sections[1])]
    rows = [line for line in reps.splitlines() if line.startswith("| 0")]
    assert rows, "no reproduction row"
    for line in rows:
        cells = [c for c in line.split(" | ") if "; " in c and ", n = " in c]
        assert cells, f"a reproduction row without its n: {line[:120]}"
        for c in cells:
            n = int(c.split(", n = ")[1].split(";")[0])
            assert n == 1 or (" to " in c and ("range]" in c or "interval]" in c)), f"no interval: {c[:120]}"
    for kind in sections[1:3]:
        part = page[page.index(kind):]
        assert any(line.startswith("| 0") and ", n = " in line for line in part.splitlines()), kind



def test_fresh_draws_say_which_verdicts_held_beyond_the_notebooks_data(tmp_path):
    """Two draws beside a FAST column: a verdict kept on both draws held; one lost on a draw is labelled
    exploratory, with the draw's verdict; a claim that failed on a draw is named; fresh-draws.md gives every value."""
    from dataclasses import asdict

    from course.claims import finding
    from course.instructor.reproductions import write_reproductions

    rule = Rule("no sinks / 4 sinks", at_least=10, partly=2)
    kept = reproduction("03", "streamingllm.table2.llama2", "350x", [12, 14, 30, 11, 13], rule, tiny_config("gpt2"),
                        "5 passages")
    lost = finding("03", "eight sinks are within 5% of four", [0.01] * 5, Rule("excess", at_most=0.05),
                   tiny_config("gpt2"), "5 passages")
    REPRODUCTIONS[:] = [r for r in REPRODUCTIONS if r.notebook != "03"]
    _executed(tmp_path / "fast", "03_streaming_llm.ipynb", [kept, lost], True)

    def draw(seed: int, excess: float, held: bool) -> None:
        rows = [dict(asdict(kept), measured=20.0), dict(asdict(lost), measured=excess, low=excess, high=excess,
                                                        verdict="holds" if excess <= 0.05 else "does not hold")]
        record = {"notebook": "03_streaming_llm", "date": "2026-12-07", "commit": "abc1234", "split": f"fresh:{seed}",
                  "seconds": 90, "rows": rows,
                  "claims": [{"statement": "four sinks beat none on every passage", "held": held, "figure": 1.7}]}
        (tmp_path / "draws" / str(seed)).mkdir(parents=True)
        (tmp_path / "draws" / str(seed) / "03_streaming_llm.json").write_text(json.dumps(record))

    draw(1, 0.02, True)
    draw(2, 0.09, False)
    write_reproductions(tmp_path / "fast", tmp_path / "docs" / "reproductions.md", tmp_path / "draws")
    page = (tmp_path / "docs" / "reproductions.md").read_text(encoding="utf-8")
    assert "| fresh draws 1, 2 |" in page
    assert "held on every fresh draw |" in page                      # the reproduction kept its verdict
    assert "**exploratory**: draw 2: does not hold |" in page         # the finding did not
    assert "Of 2 rows with a verdict in the FAST column: 1 held on every draw, 0 kept the same" in page
    assert "0 of 1 held on every draw; 1 failed on a draw or are missing from one" in page
    assert "| 03 | four sinks beat none on every passage | held (1.7) | **did not hold** (1.7) | **exploratory**: " \
           "draw 2: does not hold |" in page
    values = (tmp_path / "docs" / "fresh-draws.md").read_text(encoding="utf-8")
    assert "**draw 2** (2026-12-07, commit abc1234, split `fresh:2`)" in values
    assert "0.09, n = 5 — does not hold" in values or "0.09 [0.09 to 0.09" in values
    write_reproductions(tmp_path / "fast", tmp_path / "alone.md")  # no draws: the section says how to run one
    assert "No fresh draw is on record" in (tmp_path / "alone.md").read_text(encoding="utf-8")
