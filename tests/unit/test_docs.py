"""The README and docs/ cannot drift: the README stays short and keeps its two commands,
every relative link (and #anchor) in README.md and docs/ reaches a file (and a heading), every
page of docs/ is reachable from the README, and the reference pages are what docs/gen.py
generates from the code today. No Spark."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_spec = importlib.util.spec_from_file_location("sparkdist_docs_gen", DOCS / "gen.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to
    '-'."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code is not links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make demo   # " in text and "make test   # " in text


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_is_dead(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to {target} leads nowhere"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.name}: {target}: no such heading"


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        todo += [(page.parent / t.partition("#")[0]).resolve() for t in links(page)
                 if t.partition("#")[0].endswith(".md")]
    assert set(DOCS.rglob("*.md")) <= seen


@pytest.mark.parametrize("name", sorted(gen.PAGES))
def test_the_reference_pages_are_generated_from_the_code(name):
    assert (DOCS / "reference" / name).read_text() == gen.PAGES[name](), (
        f"docs/reference/{name} is out of date: run `make docs`")


def test_params_are_grouped_by_the_mixin_that_declares_them():
    from sparkdist.models import TorchEstimator

    groups = gen.groups(TorchEstimator)
    assert sum(len(params) for params in groups.values()) == len(TorchEstimator().params)
    for mixin, params in groups.items():
        assert all(mixin.__dict__.get(p.name) is p for p in params)
    text = (DOCS / "reference" / "params.md").read_text()
    assert "## TorchEstimator" in text and "| `numWorkers` |" in text


def test_every_test_a_docs_page_cites_exists():
    """Pages cite the test behind a claim by name (`test_...`): each name is a test."""
    defined = {name for path in (ROOT / "tests").rglob("test_*.py")
               for name in re.findall(r"^def (test_\w+)\(", path.read_text(), re.MULTILINE)}
    cited = {(page.name, name) for page in DOCS.rglob("*.md")
             for name in re.findall(r"`(test_\w+)`", page.read_text())}
    assert cited and not [c for c in cited if c[1] not in defined]
