"""The course site in a real browser: every page of a site built from executed notebooks and the repository's
docs/ opens, shows its figures (each ``<img>`` decoded: ``naturalWidth > 0``), holds no error output, its
navigation links lead to pages that exist, in the syllabus's order, and every link on every page that stays on the
site leads to a page that exists and, with an anchor, to an element of that page with that id. A screenshot of
every page goes to $COURSE_SCREENSHOTS (default: the test's temporary folder).

The executed notebooks: $COURSE_EXECUTED (``scripts/test.sh`` points it at the copies it has just executed;
then every notebook must be there, and a missing browser fails the test). Without it, the quickest notebook
(01) is executed here in FAST mode and the site is built from it alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest

from course import syllabus
from course.instructor.site import BENCHMARKS, DOCS_INDEX, INDEX, build_site
from tests.browser import CHROMIUM, CHROMIUM_ARGS, browser_api, screenshot_dir

pytestmark = pytest.mark.slow  # kernels, notebooks or the real model at length: not in the contributor suite

EXECUTED = os.environ.get("COURSE_EXECUTED", "")
sync_api = browser_api(required=bool(EXECUTED))
ROOT = Path(__file__).resolve().parents[2]
QUICKEST = "01_kv_cache"

LINKS = "els => els.map(e => e.getAttribute('href'))"
IDS = "() => [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.getAttribute('name'))"
IMAGES = "els => els.map(e => ({src: e.getAttribute('src').slice(0, 40), ok: e.complete && e.naturalWidth > 0}))"
ERRORS = """() => [...document.querySelectorAll('.output_error, [data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(e => e.textContent).filter(t => t.includes('Traceback') || t.includes('Error'))"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, Path]:
    """(built site, folder of the executed notebooks it was built from)."""
    if EXECUTED:
        executed = Path(EXECUTED)
    else:
        from course.instructor.notebook_times import execute_notebook

        executed = tmp_path_factory.mktemp("executed")
        with pytest.MonkeyPatch.context() as env:
            env.delenv("MPLBACKEND", raising=False)  # the kernel draws its figures inline, as scripts/test.sh's run
            execute_notebook(ROOT / "notebooks" / f"{QUICKEST}.ipynb", executed / f"{QUICKEST}.ipynb", fast=True)
    out = tmp_path_factory.mktemp("site")
    result = build_site(executed, out, ROOT, partial=not EXECUTED)
    return out, executed, result["pages"]


def figure_count(notebook: Path) -> int:
    """How many images the executed notebook's outputs hold."""
    nb = nbformat.read(notebook, as_version=4)
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


def offline(route) -> None:
    """Pages come from disk; whatever they ask of the network (MathJax, require.js) is refused at once."""
    if route.request.url.startswith(("file:", "data:")):
        route.continue_()
    else:
        route.abort()


def test_every_page_renders_its_figures_and_links(site, tmp_path):
    out, executed, built = site
    entries = [e for e in syllabus.notebooks() if (out / e.page).is_file()]
    if EXECUTED:
        assert len(entries) == len(syllabus.notebooks())
    docs = [p for p in built if p not in {INDEX, *(e.page for e in entries)}]
    assert DOCS_INDEX in docs and BENCHMARKS in docs and "setup.html" in docs  # every docs/*.md page
    pages = [INDEX] + docs + [e.page for e in entries]
    ids: dict[str, set[str]] = {}  # every page's ids, for the links' anchors
    links: list[tuple[str, str]] = []  # (page, href) of every link that stays on the site
    shots = screenshot_dir(tmp_path)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", offline)
            page = context.new_page()
            for name in pages:
                page.goto((out / name).as_uri(), wait_until="load", timeout=60_000)
                images = page.eval_on_selector_all("img", IMAGES)
                broken = [i["src"] for i in images if not i["ok"]]
                assert not broken, f"{name}: images that did not load: {broken}"
                assert not page.evaluate(ERRORS), f"{name}: error outputs"
                assert "Traceback (most recent call last)" not in page.inner_text("body"), name
                ids[name] = set(page.evaluate(IDS))
                links += [(name, h) for h in page.eval_on_selector_all("a[href]", LINKS) if not urlparse(h).scheme]
                hrefs = page.eval_on_selector_all("nav.course-nav a", LINKS)
                local = [h for h in hrefs if not urlparse(h).scheme]
                assert {INDEX, BENCHMARKS} <= set(local), f"{name}: the bar lacks the index or benchmarks link"
                missing = [h for h in local if not (out / h).is_file()]
                assert not missing, f"{name}: links to pages that do not exist: {missing}"
                if name == INDEX:
                    linked = page.eval_on_selector_all("table a", "els => els.map(e => e.getAttribute('href'))")
                    assert [e.page for e in entries] == [h for h in linked if h.endswith(".html")]
                elif name == BENCHMARKS:
                    assert page.locator("h1").first.inner_text().startswith("Benchmarks")
                    assert len(images) >= 1  # the benchmark figures (docs/benchmarks/*.png)
                elif name == DOCS_INDEX:  # the index of docs/ lists every other docs page
                    listed = {h for h in page.eval_on_selector_all(".course-page a:not(.anchor-link)", LINKS) if h != INDEX}
                    assert listed == set(docs) - {DOCS_INDEX}, listed ^ (set(docs) - {DOCS_INDEX})
                elif name in docs:
                    assert page.locator("h1").count() >= 1, f"{name}: no title"
                else:
                    i = [e.page for e in entries].index(name)
                    want = figure_count(executed / f"{entries[i].name}.ipynb")
                    assert len(images) >= want > 0, f"{name}: {len(images)} images shown, {want} in the notebook"
                    prev = page.eval_on_selector_all("nav.course-nav a[rel=prev]", "els => els.map(e => e.getAttribute('href'))")
                    nxt = page.eval_on_selector_all("nav.course-nav a[rel=next]", "els => els.map(e => e.getAttribute('href'))")
                    assert set(prev) == ({entries[i - 1].page} if i > 0 else set())
                    assert set(nxt) == ({entries[i + 1].page} if i + 1 < len(entries) else set())
                page.screenshot(path=shots / f"{Path(name).stem}.png")
                if name in [e.page for e in entries]:  # a figure as a reader sees it
                    page.locator(".jp-RenderedImage img").first.scroll_into_view_if_needed()
                    page.screenshot(path=shots / f"{Path(name).stem}_figure.png")
        finally:
            browser.close()
    expected = [f"{Path(n).stem}.png" for n in pages] + [f"{e.name}_figure.png" for e in entries]
    assert all((shots / s).stat().st_size > 0 for s in expected)
    targets = [(page, *href.partition("#")[::2]) for page, href in links]  # (page, target page, anchor)
    dead = [(page, to) for page, to, _ in targets if to and not (out / to).is_file()]
    assert not dead, f"links to pages that do not exist: {dead}"
    missing = [(page, f"{to}#{anchor}") for page, to, anchor in targets if anchor and anchor not in ids[to or page]]
    assert not missing, f"links to anchors that do not exist: {missing}"
