"""The README and the pages of ``docs/`` link to each other: every relative link must reach a
file of the repository, and every ``#anchor`` a heading of that file (as GitHub derives anchors
from headings), so a page that moves or a heading that is renamed cannot leave a dead link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (code fences skipped)."""
    anchors, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_docs_folder_exists_with_the_reference_pages():
    assert len(PAGES) > 5, "docs/ holds the reference pages the README links"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    dead = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target}: no file {file.relative_to(ROOT) if ROOT in file.parents else file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            dead.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    assert not dead, f"{page.name} has dead links: {dead}"
