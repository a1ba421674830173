"""A LinkState reads back what it stored with no cap on one value but the payload's.

Everything it holds passed the cap of whoever received it, and an operator may raise
that past the 512 MiB default (``fedcore serve --max-value-bytes``): the state must not
refuse its own blobs then. A value over 512 MiB costs gigabytes to test, so this checks
the limits every read-back decodes with instead.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import fedcore.state.memory_runs
import fedcore.state.sqlite_contents
import fedcore.state.sqlite_runs
from fedcore.domain import ConfigRecord, Message, RecordDict, RunStatus
from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock
from fedcore.wire import DEFAULT_LIMITS, STORED_LIMITS, DecodeLimits, unpack_recorddict

pytestmark = pytest.mark.anyio

READERS: tuple[ModuleType, ...] = (
    fedcore.state.memory_runs,
    fedcore.state.sqlite_contents,
    fedcore.state.sqlite_runs,
)


def test_the_stored_limits_cap_a_value_only_by_the_payload() -> None:
    assert STORED_LIMITS.max_value_len == DEFAULT_LIMITS.max_bytes == STORED_LIMITS.max_bytes
    assert STORED_LIMITS.max_value_len > DEFAULT_LIMITS.max_value_len


@pytest.fixture(params=["memory", "sqlite"])
async def state(
    request: pytest.FixtureRequest, fake_clock: FakeClock, tmp_path: Path
) -> AsyncIterator[LinkState]:
    if request.param == "memory":
        async with InMemoryLinkState(fake_clock, seed=0) as memory:
            yield memory
    else:
        async with SqliteLinkState(tmp_path / "link.db", fake_clock, seed=0) as sqlite:
            yield sqlite


async def test_every_read_back_decodes_with_the_stored_limits(
    state: LinkState, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[DecodeLimits] = []

    def noting(data: Any, limits: DecodeLimits = DEFAULT_LIMITS) -> RecordDict:
        used.append(limits)
        return unpack_recorddict(data, limits)

    for module in READERS:
        monkeypatch.setattr(module, "unpack_recorddict", noting)
    content = RecordDict({"config": ConfigRecord({"model": b"m" * (2 << 20)})})
    run = await state.create_run({"k": 1})
    await state.update_run_status(run.run_id, RunStatus.STARTING)
    await state.update_run_status(run.run_id, RunStatus.RUNNING)
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    await state.save_context(run.run_id, node, content)
    await state.put_artifact(run.run_id, "model", content)
    await state.push_messages(run.run_id, [Message(content, node, "train")])
    assert (await state.load_context(run.run_id, node))["config"]["model"] == b"m" * (2 << 20)
    assert (await state.get_artifact(run.run_id, "model"))["config"]["model"]
    (pulled,) = await state.pull_messages(node)
    assert pulled.content["config"]["model"] == b"m" * (2 << 20)
    await state.get_run(run.run_id)
    assert used, "the state decoded nothing: the test checks nothing"
    assert all(limits is STORED_LIMITS for limits in used)
