"""The suite's async tests whose outcome may depend on the event loop, run on both.

The plugin (:mod:`fedcore.testing.plugin`) runs async tests on uvloop, production's
loop, and a test marked ``every_event_loop`` on the standard library's too. The
modules below are marked here, by file name, where the loops differ most: child
processes and their pipes, and the sockets of the fleet and HTTP servers; each costs
a second or two, so ``make test`` runs them twice and is no slower for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.plugin import EVERY_EVENT_LOOP

pytest_plugins = ["pytester"]

ON_EVERY_EVENT_LOOP = {
    "test_spawn.py": "the exec's child processes, their pipes and their ends",
    "test_launcher.py": "ServerApp processes started, watched and ended",
    "test_grpc_lost_connection.py": "a fleet connection dropped under the node",
    "test_http_server.py": "the HTTP servers' sockets",
}
"""Module file names (unique in tests/), each with the loop-sensitive thing it tests."""


def pytest_configure(config: pytest.Config) -> None:
    """A module renamed or gone would silently run on one loop only: refuse to start."""
    tests = Path(__file__).parent
    for name in ON_EVERY_EVENT_LOOP:
        if len(list(tests.rglob(name))) != 1:
            raise pytest.UsageError(
                f"tests/conftest.py: no one tests/**/{name} to run on both loops"
            )


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makemodule(module_path: Path) -> Iterator[None]:
    module = yield
    if module_path.name in ON_EVERY_EVENT_LOOP:
        module.add_marker(EVERY_EVENT_LOOP)
    return module
