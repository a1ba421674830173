"""Fixtures of the deployment tests."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest


@pytest.fixture
def low_fd_limit() -> Iterator[None]:
    """Processes started inside get 256 file descriptors; this one may open thousands."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
