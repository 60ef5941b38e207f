"""The front page and the pages behind it: README.md short, docs/README.md indexing every page, every relative link
and anchor of README.md and docs/*.md leading somewhere, and the commands the front page promises being the ones
CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course.instructor.doc_pages import anchors, broken_links, pages, relative_links, slug

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FRONT_PAGE_LINES = 120


@pytest.mark.parametrize("page", pages(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_front_page_is_short_and_links_to_the_index():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FRONT_PAGE_LINES
    assert "docs/README.md" in relative_links(text)


def test_the_index_lists_every_page_once():
    index = ROOT / "docs" / "README.md"
    listed = [t for t in relative_links(index.read_text(encoding="utf-8")) if not t.startswith("..")]
    on_disk = sorted(p.name for p in pages(ROOT)[2:])
    assert sorted(listed) == on_disk, "docs/README.md must list every docs/*.md page exactly once"


def test_the_front_page_gives_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert "bash scripts/run-course.sh" in commands and "bash scripts/test.sh" in commands
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def command_line_page() -> list[tuple[str, str, tuple[str, ...]]]:
    """docs/command-line.md's groups: (title, the line under it, the commands its code block runs, in order)."""
    page = (ROOT / "docs" / "command-line.md").read_text(encoding="utf-8")
    groups = []
    for section in page.split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        line = body.strip().split("\n\n", 1)[0]
        block = re.search(r"^```\n(.*?)^```", body, re.M | re.S)
        names = re.findall(r"^python -m course (\S+)", block.group(1) if block else "", re.M)
        groups.append((title, line, tuple(dict.fromkeys(names))))
    return groups


def test_help_lists_the_command_groups_in_the_words_and_order_of_the_command_line_page(capsys):
    from course import cli
    from course.__main__ import main

    assert command_line_page() == [tuple(g) for g in cli.GROUPS]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    lines = [f"  {g.title}: {g.line}" for g in cli.GROUPS]
    assert all(line in shown.splitlines() for line in lines), shown
    assert [shown.index(line) for line in lines] == sorted(shown.index(line) for line in lines)
    assert all(f"    {c.name}" in shown for c in cli.COMMANDS)  # each command with its own line of help


@pytest.mark.parametrize("heading, expected", [
    ("Models and texts, online and offline", "models-and-texts-online-and-offline"),
    ("A policy inside transformers' `generate()`", "a-policy-inside-transformers-generate"),
    ("01 · The KV cache", "01--the-kv-cache"),
    ("Results: reproductions, illustrations, findings", "results-reproductions-illustrations-findings"),
    ("The head-wise caches against kvpress", "the-head-wise-caches-against-kvpress"),
])
def test_anchors_follow_githubs_rule(heading, expected):
    assert slug(heading) == expected


def test_a_repeated_heading_is_numbered_and_code_is_not_a_heading():
    text = "# Top\n## Notes\n## Notes\n```\n# not a heading\n[x](nowhere.md)\n```\n<a id=\"here\"></a>\n"
    assert anchors(text) == {"top", "notes", "notes-1", "here"}
    assert relative_links(text) == []


def test_a_missing_page_or_anchor_is_reported(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## Only heading\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#only-heading) [gone](missing.md) [wrong](a.md#nothing) [web](https://example.org) "
                    "[self](#b) ![pic](img.png)\n\n# B\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md: no file missing.md",
                                  "a.md#nothing: a.md has no heading or anchor 'nothing'", "img.png: no file img.png"]
