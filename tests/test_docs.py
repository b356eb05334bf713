"""The README and the guides in docs/ link only to files that exist, and to headings they have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(path: Path) -> str:
    """The file without its code blocks (whose lines are neither headings nor links)."""
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", prose(path), re.MULTILINE)}


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z]+://|mailto:", t)]


def test_there_are_guides():
    assert len(DOCS) > 5


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_link_resolves(doc):
    for target in links(doc):
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(path), f"{doc.name}: link to {target}: no such heading"


CITE = re.compile(r"BENCHMARKS\.md[,;]?\s+\*([^*]+)\*")


def test_cited_benchmark_sections_exist():
    """Docs and docstrings cite BENCHMARKS.md by section (``BENCHMARKS.md, *Plan vs simulator*``):
    every section cited is a heading there."""
    headings = [m.group(1) for m in re.finditer(r"^#+\s+(.*)$", (REPO_ROOT / "BENCHMARKS.md").read_text(),
                                                 re.MULTILINE)]
    sources = DOCS + [p for d in ("helix", "planner", "coordinator", "worker", "scripts")
                      for p in sorted((REPO_ROOT / d).rglob("*.py"))]
    cited = set()
    for path in sources:
        flat = re.sub(r"\s*\n\s*(#:?\s*)?", " ", path.read_text())   # a cite may wrap a line
        cited |= {(path.name, " ".join(c.split())) for c in CITE.findall(flat)}
    assert cited
    missing = sorted((name, c) for name, c in cited if not any(h.startswith(c) for h in headings))
    assert not missing, f"sections cited but not in BENCHMARKS.md: {missing}"


@pytest.mark.parametrize("name,most", [("README.md", 200), ("BENCHMARKS.md", 500)])
def test_the_front_pages_stay_short(name, most):
    """README is one or two screenfuls (the guides are in docs/); BENCHMARKS.md holds each
    benchmark's current figure once (history is in git)."""
    lines = len((REPO_ROOT / name).read_text().splitlines())
    assert lines <= most, f"{name} has {lines} lines; keep it to {most}"
