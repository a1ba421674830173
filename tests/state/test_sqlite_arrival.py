"""SqliteLinkState judges a heartbeat at the time it arrived, not when its turn came.

A slow transaction is made by another connection holding the file's write lock: the
state's next transaction waits for it in its worker thread, and the calls made
meanwhile queue behind it. A heartbeat that arrives before its deadline, then waits
past it, must keep its node online (its open message is not failed with code 5) and
its ServerApp's run running.

The in-memory state has nothing to wait for: each call runs, and reads the clock, the
moment it is made.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio
import pytest
from sqlite_helpers import state_on

from fedcore.domain import ConfigRecord, ErrorCode, Message, RecordDict, RunStatus
from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import PATIENCE

pytestmark = pytest.mark.anyio

INTERVAL = 1.0
EPSILON = 0.01
CLAIM = 60.0


@contextmanager
def write_lock_held(path: Path) -> Iterator[Callable[[], None]]:
    """Hold the file's write lock from another connection; yield what releases it."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield lambda: other.execute("COMMIT")
    finally:
        other.close()


async def node_with_a_message(state: SqliteLinkState) -> tuple[int, int, str]:
    """A node heartbeating every ``INTERVAL``, sent a message that outlives the test:
    its id, its run's and the message's."""
    node_id = await state.create_node(heartbeat_interval=INTERVAL)
    run_id = (await state.create_run({})).run_id
    content = RecordDict({"config": ConfigRecord({"x": 1})})
    (message_id,) = await state.push_messages(
        run_id, [Message(content, node_id, "train", ttl=600.0)]
    )
    return node_id, run_id, message_id


async def beat_late(
    path: Path, clock: FakeClock, state: SqliteLinkState, heartbeat: Callable[[], Awaitable[object]]
) -> None:
    """Send ``heartbeat`` just before the deadline while a slow transaction runs, and let
    the deadline pass (the reaper wakes for it) before the transaction ends."""
    with write_lock_held(path) as release:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(state.get_node_ids)  # the slow transaction
            await anyio.wait_all_tasks_blocked()
            clock.advance(PATIENCE * INTERVAL - EPSILON)
            tasks.start_soon(heartbeat)
            await anyio.wait_all_tasks_blocked()
            clock.advance(2 * EPSILON)
            await anyio.wait_all_tasks_blocked()
            release()


async def test_a_node_heartbeat_that_arrived_in_time_keeps_its_node(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        node_id, run_id, message_id = await node_with_a_message(state)

        async def heartbeat() -> None:
            await state.heartbeat(node_id, heartbeat_interval=INTERVAL)

        await beat_late(path, fake_clock, state, heartbeat)
        assert await state.get_replies(run_id, [message_id]) == [], "answered: node offline"
        assert await state.get_node_ids() == [node_id]
        (pulled,) = await state.pull_messages(node_id)
        assert pulled.metadata.message_id == message_id


async def test_a_serverapp_heartbeat_that_arrived_in_time_keeps_its_run(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        (claim,) = await state.claim_runs(limit=1, lease=CLAIM)
        await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)

        async def heartbeat() -> None:
            await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)

        await beat_late(path, fake_clock, state, heartbeat)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.RUNNING, run.reason


async def test_a_heartbeat_that_arrived_late_still_counts_as_missed(
    path: Path, fake_clock: FakeClock
) -> None:
    """The other side of the rule: arriving after the deadline, queued or not, is late."""
    async with state_on(path, fake_clock) as state:
        node_id, run_id, message_id = await node_with_a_message(state)
        with write_lock_held(path) as release:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(state.get_node_ids)
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(PATIENCE * INTERVAL + EPSILON)
                tasks.start_soon(partial(state.heartbeat, node_id, heartbeat_interval=INTERVAL))
                await anyio.wait_all_tasks_blocked()
                release()
        (reply,) = await state.get_replies(run_id, [message_id])
        assert reply.error.code == ErrorCode.NODE_UNAVAILABLE
