"""Fixtures the SQLite state's test files share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """Where a test's link database lives."""
    return tmp_path / "link.db"
