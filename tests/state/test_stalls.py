"""The link's own stalls are not blamed on its peers (fedcore.state.stalls), in both states.

A stall is time passing while the state's tasks cannot run: with the fake clock, one
big ``advance`` before anything runs; with the real one, a blocked event loop.
Deadlines that fell inside it are re-armed; a peer that stays silent afterwards is
still found, within the usual bound counted from the stall's end.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from fedcore.clock import Clock, SystemClock
from fedcore.domain import RunStatus
from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.sqlite import SqliteLinkState
from fedcore.state.stalls import STALL_PERIOD, StallWatch
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import advance, message, settle

pytestmark = pytest.mark.anyio

PATIENCE = 2.0
INTERVAL = 1.0
STALL = 10.0
"""Far longer than any deadline the tests set: everything due falls inside it."""
EPSILON = 0.01

Open = Callable[[Clock, StallWatch | None], AbstractAsyncContextManager[LinkState]]


@pytest.fixture(params=["memory", "sqlite"])
def open_state(request: pytest.FixtureRequest, tmp_path: Path) -> Open:
    def open_(clock: Clock, stalls: StallWatch | None) -> AbstractAsyncContextManager[LinkState]:
        if request.param == "memory":
            return InMemoryLinkState(clock, heartbeat_patience=PATIENCE, stalls=stalls)
        return SqliteLinkState(
            tmp_path / "link.db", clock, heartbeat_patience=PATIENCE, stalls=stalls
        )

    return open_


@pytest.fixture
async def state(open_state: Open, fake_clock: FakeClock) -> AsyncIterator[LinkState]:
    async with open_state(fake_clock, StallWatch(fake_clock)) as state:
        await settle()
        yield state


async def steps(clock: FakeClock, seconds: float) -> None:
    """Let ``seconds`` pass with the loop running all along: no stall."""
    for _ in range(round(seconds / STALL_PERIOD)):
        await advance(clock, STALL_PERIOD)


async def test_a_node_whose_deadline_fell_in_a_stall_stays_online(
    state: LinkState, fake_clock: FakeClock
) -> None:
    node_id = await state.create_node(heartbeat_interval=INTERVAL)
    await advance(fake_clock, STALL)
    assert await state.get_node_ids() == [node_id], "the link's stall was blamed on the node"
    # Silent from here on, it is still found, a full patience after the stall.
    await steps(fake_clock, PATIENCE * INTERVAL - 2 * STALL_PERIOD)
    assert await state.get_node_ids() == [node_id]
    await steps(fake_clock, 4 * STALL_PERIOD)
    assert await state.get_node_ids() == []


async def test_without_a_stall_the_same_silence_takes_the_node_offline(
    state: LinkState, fake_clock: FakeClock
) -> None:
    await state.create_node(heartbeat_interval=INTERVAL)
    await steps(fake_clock, PATIENCE * INTERVAL + 2 * STALL_PERIOD)
    assert await state.get_node_ids() == []


async def test_a_state_without_a_watch_fires_what_fell_in_a_stall(
    open_state: Open, fake_clock: FakeClock
) -> None:
    async with open_state(fake_clock, None) as state:
        await state.create_node(heartbeat_interval=INTERVAL)
        await advance(fake_clock, STALL)
        assert await state.get_node_ids() == []


async def test_a_running_run_whose_deadline_fell_in_a_stall_goes_on(
    state: LinkState, fake_clock: FakeClock
) -> None:
    await state.create_run({})
    (claim,) = await state.claim_runs(limit=1, lease=1.0)
    run_id = claim.run.run_id
    await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
    await advance(fake_clock, STALL)
    assert (await state.get_run(run_id)).status is RunStatus.RUNNING
    await steps(fake_clock, PATIENCE * INTERVAL + 2 * STALL_PERIOD)
    assert (await state.get_run(run_id)).status is RunStatus.FAILED


async def test_a_claim_that_ran_out_in_a_stall_is_kept(
    state: LinkState, fake_clock: FakeClock
) -> None:
    await state.create_run({})
    (claim,) = await state.claim_runs(limit=1, lease=1.0)
    await advance(fake_clock, STALL)
    run = await state.get_run(claim.run.run_id)
    assert run.status is RunStatus.STARTING
    # Still the claimant's: the renewal is not refused as a lost claim.
    renewed = await state.renew_claim(run.run_id, claim.token, lease=1.0)
    assert renewed == fake_clock.now() + 1.0


async def test_a_lease_that_ran_out_in_a_stall_is_not_redelivered(
    state: LinkState, fake_clock: FakeClock
) -> None:
    node_id = await state.create_node(heartbeat_interval=100.0)
    run_id = (await state.create_run({})).run_id
    await state.update_run_status(run_id, RunStatus.STARTING)
    await state.update_run_status(run_id, RunStatus.RUNNING)
    (message_id,) = await state.push_messages(run_id, [message(node_id)])
    (pulled,) = await state.pull_messages(node_id, lease=1.0)
    assert pulled.metadata.message_id == message_id
    await advance(fake_clock, STALL)
    assert await state.pull_messages(node_id) == []
    assert await state.renew_leases(node_id, [message_id], lease=1.0) == []


async def test_a_ttl_still_expires_in_a_stall(state: LinkState, fake_clock: FakeClock) -> None:
    # A TTL is the ServerApp's promise, and its clock ran on: it is not moved.
    node_id = await state.create_node(heartbeat_interval=100.0)
    run_id = (await state.create_run({})).run_id
    await state.update_run_status(run_id, RunStatus.STARTING)
    await state.update_run_status(run_id, RunStatus.RUNNING)
    (message_id,) = await state.push_messages(run_id, [message(node_id, ttl=1.0)])
    await advance(fake_clock, STALL)
    (answer,) = await state.get_replies(run_id, [message_id])
    assert answer.has_error()


async def test_a_blocked_event_loop_does_not_take_nodes_offline(open_state: Open) -> None:
    # The real thing: the link's own loop held for longer than the node's deadline.
    clock = SystemClock()
    interval = 0.2
    async with open_state(clock, StallWatch(clock)) as state:
        node_id = await state.create_node(heartbeat_interval=interval)
        await settle()
        time.sleep(4 * PATIENCE * interval)  # noqa: ASYNC251 - the stall under test
        assert await state.get_node_ids() == [node_id]
