"""The course site's documentation pages: docs/README.md (the index, ``docs.html``) and every other docs/*.md
(``NAME.html``), and the links of every page of the site pointed at them and at the notebooks' pages.

A link between the course's markdown pages (``setup.md#colab-and-binder``, ``../docs/references.md``,
``../README.md``) becomes a link between the site's pages (``setup.html#colab-and-binder``, ``references.html``,
``index.html``), and every heading gets GitHub's anchor (``course.instructor.doc_pages.slug``), so an anchor that
works on GitHub works on the site. A documentation page that links to a file of the repository the site does not
hold (a script, a module) is refused by name: link to it by its full address instead.
"""

from __future__ import annotations

import html
import re
from pathlib import Path, PurePosixPath

from course.instructor.doc_pages import INDEX as DOCS_README
from course.instructor.doc_pages import numbered, slug

__all__ = ["DOCS_INDEX", "doc_sources", "page_of", "site_links", "heading_ids"]

DOCS_INDEX = "docs.html"
HREF = re.compile(r'href="([^"]*)"')
HEADING = re.compile(r"<h([1-6])((?:\s[^>]*)?)>(.*?)</h\1>", re.S)
ANCHOR_LINK = re.compile(r'<a class="anchor-link" href="#[^"]*">[^<]*</a>')


def page_of(repo_path: str) -> str | None:
    """The site's page for a file of the repository (a POSIX path from its root), or None when it has none:
    README.md is index.html, docs/README.md docs.html, docs/NAME.md NAME.html, notebooks/NN_name.ipynb (a solution
    notebook, or its student copy) NN_name.html."""
    path = PurePosixPath(repo_path)
    if path == PurePosixPath("README.md"):
        return "index.html"
    if path.parent in (PurePosixPath("notebooks"), PurePosixPath("notebooks/student")) and path.suffix == ".ipynb":
        return f"{path.stem}.html"
    if path.parent == PurePosixPath("docs") and path.suffix == ".md":
        return DOCS_INDEX if path.name == DOCS_README else f"{path.stem}.html"
    return None


def doc_sources(root: Path) -> dict[str, Path]:
    """{site page: markdown file} for docs/README.md and every docs/*.md of the repository ``root``."""
    docs = root / "docs"
    return {page_of(f"docs/{p.name}"): p for p in sorted(docs.glob("*.md"))} if docs.is_dir() else {}


def _resolve(source_dir: str, target: str) -> str | None:
    """``target`` (relative to ``source_dir``, a folder of the repository) as a path from the repository's root,
    or None when it leaves the repository."""
    parts: list[str] = []
    for part in PurePosixPath(source_dir, target).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def site_links(rendered: str, source_dir: str, where: str, strict: bool = True) -> str:
    """``rendered`` HTML of a page whose markdown lives in ``source_dir`` ("" for README.md, "docs", "notebooks")
    with every link to one of the course's markdown pages pointed at the site's page. With ``strict`` (the
    documentation pages) any other link into the repository raises ``ValueError`` naming ``where``."""
    def point(m: re.Match) -> str:
        target = html.unescape(m.group(1))
        if not target or target.startswith("#") or re.match(r"^[a-z][a-z0-9+.-]*:|^//", target, re.I):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        repo_path = _resolve(source_dir, path)
        page = page_of(repo_path) if repo_path is not None else None
        if page is not None:
            return f'href="{html.escape(page + hash_ + anchor)}"'
        if strict:
            raise ValueError(f"{where} links to {target!r}, which is not a page of the course site: link to the "
                             "course's pages (README.md, docs/*.md), or to another file by its full address")
        return m.group(0)
    return HREF.sub(point, rendered)


def heading_ids(rendered: str) -> str:
    """``rendered`` markdown (nbconvert's ``markdown2html``, which gives headings ids of its own) with every
    heading's id, and its pilcrow link, set to GitHub's anchor of its text (a repeated one numbered -1, -2, ...), so
    ``page.html#anchor`` finds what ``page.md#anchor`` finds on GitHub."""
    seen: dict[str, int] = {}

    def give(m: re.Match) -> str:
        level, attrs, inner = m.groups()
        text = ANCHOR_LINK.sub("", inner)
        anchor = html.escape(numbered(slug(html.unescape(re.sub(r"<[^>]+>", "", text))), seen))
        attrs = re.sub(r'\s+id="[^"]*"', "", attrs)
        inner = ANCHOR_LINK.sub(f'<a class="anchor-link" href="#{anchor}">&#182;</a>', inner)
        return f'<h{level}{attrs} id="{anchor}">{inner}</h{level}>'
    return HEADING.sub(give, rendered)
