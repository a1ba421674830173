"""The fixtures the node role's tests share: a fake link, and the flaky connection to it."""

from __future__ import annotations

import pytest
from node_helpers import FlakyFleet

from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet


@pytest.fixture
def fake(fake_clock: FakeClock) -> FakeFleet:
    return FakeFleet(fake_clock)


@pytest.fixture
def fleet(fake: FakeFleet) -> FlakyFleet:
    return FlakyFleet(fake)
