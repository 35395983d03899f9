"""Every relative link of the README and docs/ resolves, anchors included, and so does every
docs page named by the code's messages, `--help` and the chart's NOTES."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "charts/cron-runner/README.md",
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (
            anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)
        ):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_docs_pages_named_by_the_code_and_the_chart_exist() -> None:
    named: set[str] = set()
    sources = [*ROOT.glob("runner/**/*.py"), *ROOT.glob("charts/cron-runner/templates/**/*.*")]
    for source in sources:
        named.update(re.findall(r"\bdocs/[\w-]+\.md", source.read_text()))
    assert named, "no docs page named anywhere: the pattern is wrong"
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, missing


def test_the_readme_fits_its_job() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_user_docs_do_not_say_how_the_project_was_made() -> None:
    said = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"[Ss]eed 00\d|\bissue #?\d{1,3}\b|§", line):
                said.append(f"{page.name}:{number}")
    assert not said, said
