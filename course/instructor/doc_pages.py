"""The course's markdown pages (README.md and docs/*.md) and the links between them.

Anchors follow GitHub's rule for headings (``slug``), so a link such as ``setup.md#colab-and-binder`` works on
GitHub, in JupyterLab's markdown viewer and on the course site, which gives every heading the same id
(``course.instructor.site``). ``broken_links`` lists every relative link of a page that leads nowhere: a missing
file, or an anchor that no heading or ``<a id=...>`` of the target defines. ``tests/test_docs.py`` runs it on
every page.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

__all__ = ["slug", "numbered", "anchors", "relative_links", "broken_links", "pages", "INDEX"]

INDEX = "README.md"  # docs/README.md: every page under docs/, grouped by reader
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
EXPLICIT = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its words
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` or ``[x](y)`` there is code, not markup)."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    """Every anchor a markdown page defines: its headings' slugs (a repeated one numbered -1, -2, ... as GitHub
    does) and its explicit ``<a id="...">``."""
    seen: dict[str, int] = {}
    return set(EXPLICIT.findall(text)) | {numbered(slug(heading), seen) for _, heading in HEADING.findall(_prose(text))}


def numbered(base: str, seen: dict[str, int]) -> str:
    """``base`` the first time ``seen`` meets it, then ``base-1``, ``base-2``, ... (GitHub's rule for repeated
    headings); ``seen`` counts, one dict per page."""
    n = seen.get(base, 0)
    seen[base] = n + 1
    return base if n == 0 else f"{base}-{n}"


def relative_links(text: str) -> list[str]:
    """The targets of a page's links and images that stay inside the repository (no scheme, no ``//``)."""
    prose = _prose(text)
    targets = LINK.findall(prose) + IMAGE.findall(prose)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^//", t, re.I)]


def broken_links(page: Path) -> list[str]:
    """``"target: why"`` for every relative link of the markdown ``page`` that leads nowhere ([] when none)."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in relative_links(text):
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page.resolve()
        if not dest.exists():
            problems.append(f"{target}: no file {dest.name}")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{target}: {dest.name} has no heading or anchor '{anchor}'")
    return problems


def pages(root: Path) -> list[Path]:
    """The course's markdown pages: README.md, then docs/README.md (the index), then the rest of docs/*.md."""
    docs = root / "docs"
    rest = sorted(p for p in docs.glob("*.md") if p.name != INDEX)
    return [root / "README.md", docs / INDEX, *rest]
