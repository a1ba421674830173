"""Files of Flower's repository at one commit, taken at test time, never copied here.

The tests that run Flower's material as it is — its example apps
(:mod:`fedcore.testing.flower_examples`) and its own unit tests
(:mod:`fedcore.testing.flower_unit`) — extract it with ``git archive`` from the
repository ``$FEDCORE_FLOWER_REPO`` names (a work tree or a bare git directory of
adap/flower) at :data:`FLOWER_COMMIT`, so every run sees the same code.
"""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

FLOWER_REPO_ENV = "FEDCORE_FLOWER_REPO"
FLOWER_COMMIT = "fdef7afb1dca3030553be302366cfd285ed6632c"
"""The commit of adap/flower whose files the tests take."""


class FlowerRepoUnavailable(Exception):
    """No clone of Flower's repository is named, or it lacks what was asked for at the commit."""


def flower_repo() -> str:
    """The clone ``$FEDCORE_FLOWER_REPO`` names, or :class:`FlowerRepoUnavailable`."""
    repo = os.environ.get(FLOWER_REPO_ENV)
    if not repo:
        raise FlowerRepoUnavailable(f"set {FLOWER_REPO_ENV} to a clone of adap/flower")
    return repo


def flower_paths(patterns: Sequence[str]) -> list[str]:
    """The files at :data:`FLOWER_COMMIT` that match any of the glob ``patterns``
    (``*`` stays within one directory), sorted; each pattern must match at least one."""
    repo = flower_repo()
    listing = subprocess.run(
        ["git", "-C", repo, "ls-tree", "-r", "--name-only", FLOWER_COMMIT],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:
        raise FlowerRepoUnavailable(f"{repo} has no commit {FLOWER_COMMIT[:10]}")
    files = listing.stdout.splitlines()
    found: set[str] = set()
    for pattern in patterns:
        matched = [f for f in files if _matches(f, pattern)]
        if not matched:
            raise FlowerRepoUnavailable(f"{repo} has no {pattern} at {FLOWER_COMMIT[:10]}")
        found.update(matched)
    return sorted(found)


def _matches(path: str, pattern: str) -> bool:
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def extract_flower(paths: Sequence[str], into: Path) -> None:
    """Flower's ``paths`` (files or directories) at :data:`FLOWER_COMMIT`, under ``into``
    at the same relative paths."""
    repo = flower_repo()
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", FLOWER_COMMIT, *paths],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise FlowerRepoUnavailable(
            f"{repo} lacks one of {', '.join(paths)} at {FLOWER_COMMIT[:10]}"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
