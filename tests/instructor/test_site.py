"""course.instructor.site on small made-up executed notebooks (no kernel, no browser): the pages, the navigation, the
landing page's table, the benchmarks page with its images, and what is refused."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402

from course import syllabus  # noqa: E402
from course.cli import COMMANDS  # noqa: E402
from course.instructor.site import DOC_PAGES, build_site, check_executed  # noqa: E402

README = """# the course

A course.

| notebook | teaches |
|---|---|
| `01_first` | the **first** thing |
| `02_second` | the second thing |
| `03_third` | the third thing |

## Quick start
"""
NOTEBOOKS = (syllabus.Notebook("01_first", "the **first** thing"), syllabus.Notebook("02_second", "the second thing"),
             syllabus.Notebook("03_third", "the third thing"))


@pytest.fixture(autouse=True)
def made_up_syllabus(monkeypatch):
    """The made-up notebooks are the course's notebooks (``course.syllabus``) for these tests."""
    monkeypatch.setattr(syllabus, "NOTEBOOKS", NOTEBOOKS)


def png() -> str:
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def executed_notebook(title: str, error: bool = False, ran: bool = True) -> nbformat.NotebookNode:
    code = new_code_cell("plot()", execution_count=1 if ran else None,
                         outputs=[new_output("display_data", data={"image/png": png(), "text/plain": "<Figure>"})])
    if error:
        code.outputs.append(new_output("error", ename="AssertionError", evalue="no", traceback=["Traceback"]))
    nb = new_notebook(cells=[new_markdown_cell(f"# {title}\n\nText."), code])
    nb.metadata["papermill"] = {"parameters": {"FAST": True}, "end_time": "2026-01-02T03:04:05", "duration": 90.0}
    return nb


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "docs" / "benchmarks").mkdir(parents=True)
    (root / "README.md").write_text(README, encoding="utf-8")
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n', encoding="utf-8")
    (root / "docs" / "benchmarks.md").write_text("# Benchmarks\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                                                 "![speed](benchmarks/speed.png)\n", encoding="utf-8")
    (root / "docs" / "benchmarks" / "speed.png").write_bytes(base64.b64decode(png()))
    return root


@pytest.fixture
def executed(tmp_path) -> Path:
    folder = tmp_path / "executed"
    folder.mkdir()
    for name in ("01_first", "02_second", "03_third"):
        nbformat.write(executed_notebook(f"Notebook {name}"), folder / f"{name}.ipynb")
    return folder


def nav_links(page: str) -> list[list[str]]:
    """The hrefs of every navigation bar of a page."""
    return [re.findall(r'href="([^"]+)"', bar) for bar in re.findall(r'<nav class="course-nav">(.*?)</nav>', page)]


def test_every_notebook_becomes_a_page_with_its_figure_and_links_in_order(repo, executed, tmp_path):
    out = tmp_path / "site"
    result = build_site(executed, out, repo)
    assert result["missing"] == [] and result["notebooks"] == ["01_first", "02_second", "03_third"]
    assert sorted(p.name for p in out.glob("*.html")) == sorted(result["pages"])
    pages = {n: (out / f"{n}.html").read_text(encoding="utf-8") for n in result["notebooks"]}
    for page in pages.values():
        assert page.count('src="data:image/png;base64,') == 1  # the figure, inside the page
        assert "FAST = True" in page and "1.5 min" in page  # how it was executed (papermill's record)
    bar = ["index.html", "docs.html", "benchmarks.html", "references.html", "reproductions.html"]
    assert nav_links(pages["01_first"]) == [bar + ["02_second.html"]] * 2
    assert nav_links(pages["02_second"])[0] == bar + ["01_first.html", "03_third.html"]
    assert nav_links(pages["03_third"])[0] == bar + ["02_second.html"]
    assert "<title>Notebook 02_second</title>" in pages["02_second"]


def test_the_index_lists_the_syllabus_and_the_benchmarks_show_their_images(repo, executed, tmp_path):
    out = tmp_path / "site"
    build_site(executed, out, repo)
    index = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'<td><a href="([^"]+)">', index) == ["01_first.html", "02_second.html", "03_third.html"]
    assert "the <strong>first</strong> thing" in index and "<p>A course.</p>" in index
    bench = (out / "benchmarks.html").read_text(encoding="utf-8")
    assert '<img src="images/speed.png"' in bench and (out / "images" / "speed.png").is_file()
    assert "<td>1</td>" in bench


def test_references_and_reproductions_are_pages_and_the_notebooks_links_reach_them(repo, executed, tmp_path):
    (repo / "docs" / "references.md").write_text("# References\n\n* **[S]** Xiao et al., arXiv 2309.17453\n\n"
                                                 "See [the table](reproductions.md).\n", encoding="utf-8")
    nb = executed_notebook("Notebook 02_second")
    nb.cells[0].source += "\n\nSources: [`docs/references.md`](../docs/references.md#streamingllm)."
    nbformat.write(nb, executed / "02_second.ipynb")
    out = tmp_path / "site"
    result = build_site(executed, out, repo)
    assert {"references.html", "reproductions.html"} <= set(result["pages"])
    refs = (out / "references.html").read_text(encoding="utf-8")
    assert "arXiv 2309.17453" in refs and 'href="reproductions.html"' in refs
    assert "python -m course reproductions" in (out / "reproductions.html").read_text(encoding="utf-8")  # not yet
    page = (out / "02_second.html").read_text(encoding="utf-8")
    assert 'href="references.html#streamingllm"' in page and "../docs/references.md" not in page
    assert 'href="reproductions.html"' in (out / "index.html").read_text(encoding="utf-8")


def test_the_reproductions_page_shows_the_rows_of_the_notebooks_shown(repo, executed, tmp_path):
    from course.claims import REPRODUCTION_MIME

    row = {"notebook": "02", "result": "streamingllm.table1", "source": "Xiao et al. (2023, arXiv 2309.17453), Table 1",
           "quantity": "window only / 4 sinks", "paper": "955x", "measured": 14.2, "model": "smollm2-135m",
           "scale": "6 passages", "verdict": "reproduced", "reason": "window only / 4 sinks = 14.2 >= 10",
           "rule": "reproduced: window only / 4 sinks >= 10"}
    nb = executed_notebook("Notebook 02_second")
    nb.cells[1].outputs.append(new_output("display_data", data={"text/plain": "rows",
                                                                REPRODUCTION_MIME: {"notebook": "02", "rows": [row]}}))
    nbformat.write(nb, executed / "02_second.ipynb")
    (repo / "docs" / "reproductions.md").write_text("# Reproductions\n\nan old table\n", encoding="utf-8")
    out = tmp_path / "site"
    build_site(executed, out, repo)
    page = (out / "reproductions.html").read_text(encoding="utf-8")
    assert "<strong>reproduced</strong>" in page and "14.2" in page and "an old table" not in page


def test_every_docs_page_is_a_page_with_its_links_pointed_at_the_sites_pages(repo, executed, tmp_path):
    docs = repo / "docs"
    (docs / "README.md").write_text("# Pages\n\n* [setup.md](setup.md)\n* [the front page](../README.md)\n",
                                    encoding="utf-8")
    (docs / "setup.md").write_text("# Setting up\n\n## Colab and `Binder`\n\n## Notes\n\n## Notes\n\n"
                                   "See [below](#colab-and-binder), [the table](benchmarks.md#tables) and "
                                   "[refs](references.md).\n", encoding="utf-8")
    (repo / "README.md").write_text(README + "\nDetails: [setup](docs/setup.md#colab-and-binder).\n", encoding="utf-8")
    nb = executed_notebook("Notebook 01_first")
    nb.cells[0].source += ("\n\nSee [the ledger](../docs/setup.md#notes), [home](../README.md) and "
                           "[the next notebook](02_second.ipynb).")
    nbformat.write(nb, executed / "01_first.ipynb")
    out = tmp_path / "site"
    result = build_site(executed, out, repo)
    assert {"docs.html", "setup.html"} <= set(result["pages"])
    setup = (out / "setup.html").read_text(encoding="utf-8")
    assert "<title>Setting up</title>" in setup
    assert re.findall(r'<h2 id="([^"]+)"', setup) == ["colab-and-binder", "notes", "notes-1"]  # GitHub's anchors
    assert 'href="#colab-and-binder"' in setup and 'href="benchmarks.html#tables"' in setup
    assert 'href="references.html"' in setup
    index = (out / "docs.html").read_text(encoding="utf-8")
    assert 'href="setup.html"' in index and 'href="index.html"' in index and '.md"' not in index
    assert 'href="setup.html#colab-and-binder"' in (out / "index.html").read_text(encoding="utf-8")
    page = (out / "01_first.html").read_text(encoding="utf-8")
    assert 'href="setup.html#notes"' in page and 'href="index.html"' in page and 'href="02_second.html"' in page


def test_a_docs_page_linking_to_a_file_the_site_does_not_hold_is_refused(repo, executed, tmp_path):
    (repo / "docs" / "setup.md").write_text("# Setting up\n\nRun [the script](../scripts/setup.sh).\n")
    with pytest.raises(ValueError, match=r"docs/setup.md links to '../scripts/setup.sh'.*full address"):
        build_site(executed, tmp_path / "site", repo)


def test_colab_links_follow_the_courses_setting(repo, executed, tmp_path):
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n[project.urls]\nRepository = '
                                         '"https://github.com/someone/sinks"\n', encoding="utf-8")
    out = tmp_path / "site"
    build_site(executed, out, repo)
    page = (out / "02_second.html").read_text(encoding="utf-8")
    assert ("https://colab.research.google.com/github/someone/sinks/blob/main/notebooks/student/02_second.ipynb"
            in page)
    assert "https://mybinder.org/v2/gh/someone/sinks/main" in (out / "index.html").read_text(encoding="utf-8")


def test_a_missing_notebook_stops_the_build_unless_partial(repo, executed, tmp_path):
    (executed / "02_second.ipynb").unlink()
    with pytest.raises(ValueError, match="no executed copy of 02_second"):
        build_site(executed, tmp_path / "site", repo)
    result = build_site(executed, tmp_path / "site", repo, partial=True)
    assert result["missing"] == ["02_second"]
    assert nav_links((tmp_path / "site" / "01_first.html").read_text(encoding="utf-8"))[0][-1] == "03_third.html"
    assert "02_second (not in this build)" in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_a_rebuild_drops_the_page_of_a_notebook_no_longer_there(repo, executed, tmp_path):
    out = tmp_path / "site"
    build_site(executed, out, repo)
    (out / "notes.html").write_text("mine")  # not the site's: kept
    (executed / "03_third.ipynb").unlink()
    build_site(executed, out, repo, partial=True)
    assert not (out / "03_third.html").exists() and (out / "notes.html").read_text() == "mine"


@pytest.mark.parametrize(("kw", "message"), [({"ran": False}, "code cell 1 was not executed"),
                                             ({"error": True}, "code cell 1 ended in an error")])
def test_a_notebook_that_did_not_run_cleanly_is_refused(repo, executed, tmp_path, kw, message):
    nbformat.write(executed_notebook("broken", **kw), executed / "02_second.ipynb")
    with pytest.raises(ValueError, match=message):
        build_site(executed, tmp_path / "site", repo)
    with pytest.raises(ValueError, match="02_second.ipynb"):
        check_executed(nbformat.read(executed / "02_second.ipynb", as_version=4), executed / "02_second.ipynb")


def test_bad_folders_are_named(repo, tmp_path):
    with pytest.raises(ValueError, match="is not a folder of executed notebooks"):
        build_site(tmp_path / "nowhere", tmp_path / "site", repo)


def test_the_command_line_builds_the_site(repo, executed, tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for command in COMMANDS:
        command.add_parser(sub)
    args = parser.parse_args(["site", "--from", str(executed), "--out", str(tmp_path / "out"), "--root", str(repo)])
    result = args.run(args)
    pages = len(list(executed.glob("*.ipynb"))) + 1 + len(DOC_PAGES)  # the notebooks, the index, the docs pages
    assert len(result["pages"]) == pages and f"{pages} pages in" in capsys.readouterr().out
    bad = parser.parse_args(["site", "--root", str(tmp_path / "nothing")])
    with pytest.raises(ValueError, match="is not the course's repository"):
        bad.run(bad)
