"""The course as a static site: every executed notebook as one HTML page, a landing page, every page of docs/
(the benchmarks, the references, the reproduction table, ...) and their index.

    python -m course site [--from outputs] [--out site] [--partial]

Each notebook becomes a page through nbconvert's ``lab`` template (the look of JupyterLab; figures are
already inside the executed notebook as PNG data and stay in the page, so a page is one file). nbconvert is
what the notebooks' own tools (papermill, nbval, JupyterLab) already install, and it needs no Node or MyST
tool chain; the rest — the landing page with the README and its table of notebooks (``course.syllabus``,
which also gives the pages' order), one page per docs/*.md (``course.instructor.site_docs``: docs/README.md is
``docs.html``, docs/NAME.md ``NAME.html``) and a bar of links on every page (index, docs, benchmarks, references,
reproductions, previous and next notebook, Colab where the course's home is set) — is a few lines here.
``reproductions.html`` is the reproduction table of the executed notebooks shown
(``course.instructor.reproductions``; ``docs/reproductions.md`` where they recorded no rows). Every link between
the course's markdown pages (``../docs/references.md#gpt-oss``) is pointed at the site's page.

A notebook that was not executed, or that holds an error output, is refused: the site shows results, so a
page without them would be a silent failure. With ``partial=True`` notebooks missing from the folder are
listed on the landing page without a link instead of stopping the build.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import nbformat

from course import syllabus
from course.instructor.site_docs import DOCS_INDEX, doc_sources, heading_ids, site_links
from course.instructor.syllabus_files import fast_times
from course.syllabus import Notebook

__all__ = ["check_executed", "build_site", "INDEX", "DOCS_INDEX", "BENCHMARKS", "REFERENCES", "REPRODUCTIONS"]

INDEX, BENCHMARKS = "index.html", "benchmarks.html"
REFERENCES, REPRODUCTIONS = "references.html", "reproductions.html"
# the pages every build writes, with what they say when their docs/ page is missing
DOC_PAGES = {DOCS_INDEX: ("Documentation", "README.md", "No index of the documentation: docs/README.md is missing."),
             BENCHMARKS: ("Benchmarks", "benchmarks.md",
                          "No benchmark has been recorded (<code>python -m course bench</code>)."),
             REFERENCES: ("References", "references.md", "No references page: docs/references.md is missing."),
             REPRODUCTIONS: ("Reproductions", "reproductions.md",
                             "No reproduction table has been written (<code>python -m course reproductions</code>).")}
IMAGE = re.compile(r'(<img[^>]*\bsrc=")([^":#?]+)(")')  # a relative image path in rendered markdown

CSS = """
.course-nav { display: flex; gap: 1.2em; align-items: center; flex-wrap: wrap; padding: 0.6em 1em;
  margin: 0 0 1em 0; background: #f3f5f7; border-bottom: 1px solid #d0d7de; font: 14px/1.4 sans-serif; }
.course-nav a { text-decoration: none; color: #0550ae; }
.course-nav .spacer { flex: 1; }
.course-run { font: 13px/1.4 sans-serif; color: #57606a; margin: 0 1em 1em 1em; }
.course-page { max-width: 960px; margin: 0 auto; padding: 0 1em 3em 1em; font: 16px/1.55 sans-serif; }
.course-page table { border-collapse: collapse; margin: 1em 0; }
.course-page th, .course-page td { border: 1px solid #d0d7de; padding: 0.35em 0.7em; text-align: left; }
.course-page img { max-width: 100%; }
.course-page pre { background: #f6f8fa; padding: 0.7em; overflow-x: auto; }
"""


def check_executed(nb: nbformat.NotebookNode, path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` when a code cell never ran or a cell's output is an error."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if cell.get("execution_count") is None:
            raise ValueError(f"{path}: code cell {i} was not executed (build the site from executed notebooks, "
                             "e.g. `bash scripts/run-course.sh --execute --fast`)")
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            raise ValueError(f"{path}: code cell {i} ended in an error; the site is built from notebooks that ran")


def _heading(markdown: str) -> str | None:
    """The first top-level heading of ``markdown``, without its emphasis and code marks, or None."""
    m = re.search(r"^#\s+(.+)$", markdown, re.M)
    return re.sub(r"[*`]", "", m.group(1)).strip() if m else None


def _title(nb: nbformat.NotebookNode, fallback: str) -> str:
    found = (_heading(cell.source) for cell in nb.cells if cell.cell_type == "markdown")
    return next((h for h in found if h), fallback)


def _run_line(nb: nbformat.NotebookNode) -> str:
    """One line on how the notebook was executed (papermill's record), or ""."""
    pm = nb.metadata.get("papermill")
    if not pm:
        return ""
    params = ", ".join(f"{k} = {v!r}" for k, v in (pm.get("parameters") or {}).items())
    when = (pm.get("end_time") or "")[:16].replace("T", " ")
    took = f"{pm['duration'] / 60:.1f} min" if pm.get("duration") else ""
    parts = [f"parameters {params}" if params else "default parameters", f"finished {when} UTC" if when else "",
             f"in {took}" if took else ""]
    return "Executed with papermill: " + ", ".join(p for p in parts if p) + "."


def _nav(entries: list[Notebook], built: set[str], here: str, colab: dict[str, str]) -> str:
    """The bar of links at the top and bottom of every page."""
    links = [f'<a href="{INDEX}" rel="index">Index</a>', f'<a href="{DOCS_INDEX}">Docs</a>',
             f'<a href="{BENCHMARKS}">Benchmarks</a>', f'<a href="{REFERENCES}">References</a>',
             f'<a href="{REPRODUCTIONS}">Reproductions</a>']
    names = [e.name for e in entries if e.name in built]
    if here in names:
        i = names.index(here)
        if i > 0:
            links.append(f'<a href="{names[i - 1]}.html" rel="prev">&larr; {html.escape(names[i - 1])}</a>')
        if i + 1 < len(names):
            links.append(f'<a href="{names[i + 1]}.html" rel="next">{html.escape(names[i + 1])} &rarr;</a>')
        if here in colab:
            links += ['<span class="spacer"></span>', f'<a href="{html.escape(colab[here])}">Open in Colab</a>']
    return f'<nav class="course-nav">{"".join(links)}</nav>'


def _page(title: str, body: str, nav: str) -> str:
    """A plain page (the landing and benchmarks pages)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n"
            f'<body>{nav}<div class="course-page">{body}</div>{nav}</body></html>\n')


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown import markdown2html

    return markdown2html(text)


def _inline_markdown(text: str) -> str:
    """One line of markdown as inline HTML (no enclosing paragraph)."""
    return re.sub(r"^\s*<p>(.*)</p>\s*$", r"\1", _markdown(text), flags=re.S)


def _copy_images(rendered: str, src_dir: Path, out: Path) -> str:
    """Copy the images a rendered markdown page refers to (relative paths) into ``out`` beside it."""
    def copy(m: re.Match) -> str:
        src = (src_dir / m.group(2)).resolve()
        if not src.is_file():
            raise ValueError(f"{src_dir}: an image the page shows is missing: {m.group(2)}")
        dest = out / "images" / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        return f"{m.group(1)}images/{src.name}{m.group(3)}"
    return IMAGE.sub(copy, rendered)


def _colab_links(root: Path, entries: list[Notebook]) -> tuple[dict[str, str], str]:
    """Colab links per notebook (student copies) and a Binder link, from the course's one setting."""
    from course.instructor.host import read_host

    gh = read_host(root).github if (root / "pyproject.toml").is_file() else None
    if gh is None:
        return {}, ""
    owner, name = gh
    branch = read_host(root).branch
    colab = {e.name: f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/notebooks/student/"
                     f"{e.name}.ipynb" for e in entries}
    return colab, f"https://mybinder.org/v2/gh/{owner}/{name}/{branch}"


def _index(readme: str, entries: list[Notebook], built: set[str], colab: dict[str, str], binder: str,
           runs: dict[str, str], times: dict[str, str] | None) -> str:
    """The landing page: the README, its table of notebooks linked to their pages (with the FAST times where
    docs/notebook-times.md has them), how the pages were made."""
    found = syllabus.TABLE.search(readme)
    intro, outro = (readme[: found.start()], readme[found.end():]) if found else (readme, "")
    intro = re.sub(r"^# .*\n", "", intro, count=1)
    rows = []
    for e in entries:
        name = (f'<a href="{e.page}">{html.escape(e.name)}</a>' if e.name in built
                else f"{html.escape(e.name)} (not in this build)")
        extra = f' <a href="{html.escape(colab[e.name])}">Colab</a>' if e.name in colab else ""
        time = f"<td>{html.escape(times.get(e.name, 'not measured'))}</td>" if times is not None else ""
        rows.append(f"<tr><td>{name}{extra}</td><td>{_inline_markdown(e.teaches)}</td>{time}</tr>")
    head = "<th>notebook</th><th>teaches</th>" + (f"<th>{syllabus.FAST_COLUMN}</th>" if times is not None else "")
    links = f'<p>Run it yourself: <a href="{html.escape(binder)}">Binder</a> (JupyterLab, nothing to install).</p>' \
        if binder else ""
    run_notes = "".join(f"<li>{html.escape(n)}: {html.escape(r)}</li>" for n, r in runs.items() if r)
    intro, outro = (site_links(_markdown(part), "", "README.md") for part in (intro, outro))
    body = (f"<h1>attention-sinks-course</h1>{intro}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f'{links}{outro}<p>Measured speed and memory: <a href="{BENCHMARKS}">benchmarks</a>. Every '
            f'paper the course cites: <a href="{REFERENCES}">references</a>; every published result it re-runs, '
            f'beside its own number and a verdict: <a href="{REPRODUCTIONS}">reproductions</a>; every page: '
            f'<a href="{DOCS_INDEX}">docs</a>.</p>'
            + (f"<h2>How these pages were made</h2><ul>{run_notes}</ul>" if run_notes else ""))
    return heading_ids(body)


def _executed(executed: Path, entries: list[Notebook], partial: bool) -> tuple[dict[str, Path], list[str]]:
    """The executed copy of each notebook found in ``executed`` ({name: path}) and the names missing there."""
    if not executed.is_dir():
        raise ValueError(f"--from {str(executed)!r} is not a folder of executed notebooks")
    found = {e.name: executed / e.file for e in entries if (executed / e.file).is_file()}
    missing = [e.name for e in entries if e.name not in found]
    if not found or (missing and not partial):
        raise ValueError(f"{executed}: no executed copy of {', '.join(missing)} (execute them with "
                         "`bash scripts/run-course.sh --execute --fast`, or pass --partial)")
    return found, missing


def _notebook_page(nb: nbformat.NotebookNode, path: Path, name: str, nav: str, exporter) -> tuple[str, str]:
    """The page of one executed notebook (nbconvert's lab template, the bar of links above and below, how it was
    executed) and its run line."""
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(path.parent),
                                                                    "name": _title(nb, name)}})
    run = _run_line(nb)
    head = f"{nav}<div class=\"course-run\">{html.escape(run)}</div>" if run else nav
    body = re.sub(r"(<body[^>]*>\s*<main>)", lambda m: m.group(1) + head, body, count=1)
    before, sep, after = body.rpartition("</main>")
    body = before + nav + sep + after if sep else body
    body = body.replace("</head>", f"<style>{CSS}</style></head>", 1)
    return site_links(body, "notebooks", f"notebooks/{name}.ipynb", strict=False), run


def _doc_page_names(root: Path) -> list[str]:
    """Every documentation page a build writes: the fixed ones (written even when their docs/ page is missing)
    and one per other docs/*.md."""
    return [*DOC_PAGES, *(page for page in doc_sources(root) if page not in DOC_PAGES)]


def _doc_bodies(executed: Path, root: Path) -> dict[str, tuple[str, str]]:
    """{page: (title, body)} of every documentation page, rendered before anything is written (a link the site
    cannot follow stops the build there): docs/README.md as the docs index, the reproduction table the executed
    notebooks' (when they recorded rows)."""
    from course.instructor.reproductions import column_name, read_not_run, read_rows, render

    rows, run_params = read_rows(executed)  # the table of the notebooks shown, when they recorded rows
    sources, bodies = doc_sources(root), {}
    for page in _doc_page_names(root):
        path = sources.get(page)
        title, _, absent = DOC_PAGES.get(page, (path.stem if path else page, "", ""))
        text = render({column_name(executed, run_params): (rows, run_params, read_not_run(executed))}) \
            if page == REPRODUCTIONS and rows else path.read_text(encoding="utf-8") if path else None
        if text is None:
            bodies[page] = (title, f"<h1>{title}</h1><p>{absent}</p>")
            continue
        title = _heading(text) or title
        bodies[page] = (title, heading_ids(site_links(_markdown(text), "docs", f"docs/{path.name}" if path else page)))
    return bodies


def build_site(executed: Path | str, out: Path | str, root: Path | str, partial: bool = False) -> dict:
    """Build the site from the executed notebooks in ``executed`` into ``out`` (created; its old pages replaced).

    ``root`` is the repository (README.md, docs/, pyproject.toml). Every notebook of ``course.syllabus`` must be
    in ``executed`` unless ``partial``. Returns ``{"out", "pages", "notebooks", "missing"}``.
    """
    from nbconvert import HTMLExporter

    executed, out, root = Path(executed), Path(out), Path(root)
    entries = list(syllabus.notebooks())
    found, missing = _executed(executed, entries, partial)
    readme = (root / "README.md").read_text(encoding="utf-8")
    notebooks = {name: nbformat.read(path, as_version=4) for name, path in found.items()}
    for name, nb in notebooks.items():
        check_executed(nb, found[name])
    site_links(_markdown(readme), "", "README.md")  # refuses a link the site cannot follow, before any page
    docs = _doc_bodies(executed, root)

    out.mkdir(parents=True, exist_ok=True)
    for old in [INDEX, *docs] + [e.page for e in entries]:  # only what a build writes
        (out / old).unlink(missing_ok=True)
    shutil.rmtree(out / "images", ignore_errors=True)
    colab, binder = _colab_links(root, entries)
    built = set(found)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    pages, runs = [INDEX, *docs], {}
    for name, nb in notebooks.items():
        body, runs[name] = _notebook_page(nb, found[name], name, _nav(entries, built, name, colab), exporter)
        (out / f"{name}.html").write_text(body, encoding="utf-8")
        pages.append(f"{name}.html")

    nav = _nav(entries, built, "", colab)
    index = _index(readme, entries, built, colab, binder, runs, fast_times(root))
    (out / INDEX).write_text(_page("attention-sinks-course", index, nav), encoding="utf-8")
    for page, (title, body) in docs.items():  # their images beside them
        (out / page).write_text(_page(title, _copy_images(body, root / "docs", out), nav), encoding="utf-8")
    return {"out": str(out), "pages": pages, "notebooks": list(found), "missing": missing}
