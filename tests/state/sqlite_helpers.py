"""What the SQLite state's test files share besides fixtures."""

from __future__ import annotations

from pathlib import Path

from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import PATIENCE


def state_on(path: Path, clock: FakeClock) -> SqliteLinkState:
    """A state on the file at ``path``, with the conformance suite's patience."""
    return SqliteLinkState(path, clock, heartbeat_patience=PATIENCE)
