"""Flower's own example apps, taken from a clone of Flower's repository, never copied here.

The tests that run Flower's examples as they are (and the side-by-side benchmarks)
extract each one with ``git archive`` from the repository ``$FEDCORE_FLOWER_REPO``
names — a work tree or a bare git directory of adap/flower — at
:data:`FLOWER_COMMIT`, so every run sees the same code.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

FLOWER_REPO_ENV = "FEDCORE_FLOWER_REPO"
FLOWER_COMMIT = "fdef7afb1dca3030553be302366cfd285ed6632c"
"""The commit of adap/flower whose examples the tests run."""


class FlowerExampleUnavailable(Exception):
    """No clone of Flower's repository is named, or it lacks the example at the commit."""


def flower_example(name: str, into: Path) -> Path:
    """Flower's ``examples/NAME`` at :data:`FLOWER_COMMIT`, extracted under ``into``."""
    repo = os.environ.get(FLOWER_REPO_ENV)
    if not repo:
        raise FlowerExampleUnavailable(f"set {FLOWER_REPO_ENV} to a clone of adap/flower")
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", FLOWER_COMMIT, f"examples/{name}"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise FlowerExampleUnavailable(f"{repo} has no examples/{name} at {FLOWER_COMMIT[:10]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "examples" / name


def flower_example_or_skip(name: str, into: Path) -> Path:
    """:func:`flower_example`, or the calling test skipped with the reason it is not there."""
    import pytest

    try:
        return flower_example(name, into)
    except FlowerExampleUnavailable as exc:
        pytest.skip(f"{exc} (tests/flower_apps)")
