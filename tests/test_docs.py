"""The pages under docs/, the README and CONTRIBUTING.md point at things the repository has.

docs/ cites modules, tests and test names as the place each claim is kept; a file
moved or a test renamed would leave the page pointing at nothing, so each citation is
checked here, as are the relative links of the README and the pages, and the
documents they name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PAGES]

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
TEST_NAME = re.compile(r"test_\w+")
DOCUMENT_NAME = re.compile(r"\b[\w./-]*[A-Z][\w-]*\.md\b")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``."""
    anchors = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def broken_links(document: Path) -> list[str]:
    """The relative links of ``document`` whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not _leads_somewhere(resolved, anchor):
            broken.append(target)
    return broken


def _leads_somewhere(path: Path, anchor: str) -> bool:
    if not path.exists():
        return False
    return not anchor or (path.suffix == ".md" and anchor in _anchors(path))


def _source(relative: str) -> Path | None:
    """A cited ``.py`` path: from the repository's top, or inside the fedcore package."""
    for base in (ROOT, ROOT / "fedcore"):
        if (base / relative).is_file():
            return base / relative
    return None


def missing_citations(page: Path) -> list[str]:
    """The modules, tests and test names ``page`` cites that the repository lacks."""
    everything = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in ("tests", "fedcore/testing")
        for path in (ROOT / folder).rglob("*.py")
    )
    missing = []
    for token in CODE.findall(page.read_text(encoding="utf-8")):
        path, _, name = token.partition("::")
        if path.endswith(".py"):
            if not _defines(_source(path), name):
                missing.append(token)
        elif TEST_NAME.fullmatch(token) and f"def {token}(" not in everything:
            missing.append(token)
    return missing


def _defines(source: Path | None, name: str) -> bool:
    """Whether ``source`` exists and, if a name is asked for, defines it."""
    if source is None:
        return False
    return not name or f"def {name}(" in source.read_text(encoding="utf-8")


def missing_documents(document: Path) -> list[str]:
    """Documents such as ``DESIGN.md`` that ``document`` names and the repository lacks."""
    names = set(DOCUMENT_NAME.findall(document.read_text(encoding="utf-8")))
    return sorted(
        name
        for name in names
        if not (document.parent / name).exists() and not (ROOT / name).exists()
    )


def test_there_are_design_pages_and_the_readme_links_them() -> None:
    assert {page.name for page in PAGES} >= {
        "README.md",
        "architecture.md",
        "reliability.md",
        "apps.md",
        "cli.md",
        "deployment.md",
        "benchmarks.md",
    }
    assert "(docs/README.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_lead_somewhere(document: Path) -> None:
    assert broken_links(document) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_documents_named_are_in_the_repository(document: Path) -> None:
    assert missing_documents(document) == []


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_cited_modules_and_tests_exist(page: Path) -> None:
    assert missing_citations(page) == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [gone](gone.md), [here](#nowhere), DESIGN.md §2, `state/nothing.py`, "
        "`tests/test_docs.py::test_no_such_test`, `test_no_such_test_anywhere` and "
        "`tests/test_docs.py::test_the_checks_can_fail`.\n\n# Here\n"
    )
    assert broken_links(page) == ["gone.md", "#nowhere"]
    assert missing_documents(page) == ["DESIGN.md"]
    assert missing_citations(page) == [
        "state/nothing.py",
        "tests/test_docs.py::test_no_such_test",
        "test_no_such_test_anywhere",
    ]
