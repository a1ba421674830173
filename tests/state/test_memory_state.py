"""InMemoryLinkState: the conformance suite, plus what only the in-memory state promises."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from fedcore.domain import ConfigRecord, ErrorCode, Message, RecordDict
from fedcore.errors import ReplyRejectedError
from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import PATIENCE, LinkStateConformance
from fedcore.testing.recordstate import RunRecordConformance
from fedcore.testing.runstate import RunStateConformance

pytestmark = pytest.mark.anyio


class TestInMemoryLinkState(LinkStateConformance):
    @pytest.fixture
    async def state(self, fake_clock: FakeClock) -> AsyncIterator[LinkState]:
        async with InMemoryLinkState(fake_clock, seed=0, heartbeat_patience=PATIENCE) as state:
            yield state


class TestInMemoryRunState(RunStateConformance):
    @pytest.fixture
    async def state(self, fake_clock: FakeClock) -> AsyncIterator[LinkState]:
        async with InMemoryLinkState(fake_clock, seed=0, heartbeat_patience=PATIENCE) as state:
            yield state


class TestInMemoryRunRecord(RunRecordConformance):
    @pytest.fixture
    async def state(self, fake_clock: FakeClock) -> AsyncIterator[LinkState]:
        async with InMemoryLinkState(fake_clock, seed=0, heartbeat_patience=PATIENCE) as state:
            yield state


def train(node_id: int, ttl: float = 60.0) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"x": 1})}), node_id, "train", ttl=ttl)


async def ids_from(state: InMemoryLinkState) -> tuple[list[int], int, list[str]]:
    """Node, run and message ids that a fresh state hands out."""
    node_ids = await state.create_nodes(3, heartbeat_interval=1.0)
    run_id = (await state.create_run({})).run_id
    message_ids = await state.push_messages(run_id, [train(n) for n in node_ids])
    return node_ids, run_id, message_ids


async def test_the_same_seed_gives_the_same_ids(fake_clock: FakeClock) -> None:
    first = await ids_from(InMemoryLinkState(fake_clock, seed=7))
    second = await ids_from(InMemoryLinkState(FakeClock(), seed=7))
    assert first == second


async def test_different_seeds_give_different_ids(fake_clock: FakeClock) -> None:
    first = await ids_from(InMemoryLinkState(fake_clock, seed=7))
    second = await ids_from(InMemoryLinkState(fake_clock, seed=8))
    assert first[0] != second[0]
    assert first[2] != second[2]


async def test_the_reaper_answers_an_expired_message_on_its_own(fake_clock: FakeClock) -> None:
    """Past the TTL the error reply is stored and announced with no call into the state."""
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        node_id = await state.create_node(heartbeat_interval=float("inf"))
        run_id = (await state.create_run({})).run_id
        (message_id,) = await state.push_messages(run_id, [train(node_id, ttl=10.0)])
        answered = anyio.Event()
        with state.watch_replies(run_id, lambda _: answered.set()):
            fake_clock.advance(10.0)
            with anyio.fail_after(5):
                await answered.wait()
        (reply,) = await state.get_replies(run_id, [message_id])
        assert reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE


async def test_the_reaper_notices_a_silent_node_on_its_own(fake_clock: FakeClock) -> None:
    async with InMemoryLinkState(fake_clock, seed=0, heartbeat_patience=2.0) as state:
        node_id = await state.create_node(heartbeat_interval=1.0)
        gone = anyio.Event()
        with state.watch_nodes(lambda changed: gone.set() if changed == node_id else None):
            fake_clock.advance(2.0)
            with anyio.fail_after(5):
                await gone.wait()
        assert await state.get_node_ids() == []


async def test_without_its_reaper_the_state_serves_no_stale_facts(fake_clock: FakeClock) -> None:
    """Not entered, the state still applies every timer that fell due, at each call."""
    state = InMemoryLinkState(fake_clock, seed=0, heartbeat_patience=2.0)
    mortal = await state.create_node(heartbeat_interval=1.0)
    steady = await state.create_node(heartbeat_interval=float("inf"))
    run_id = (await state.create_run({})).run_id
    to_mortal, to_steady = await state.push_messages(run_id, [train(mortal), train(steady, 5.0)])
    fake_clock.advance(5.0)
    await state.ack_replies(run_id, [to_mortal, to_steady])
    replies = await state.get_replies(run_id, [to_mortal, to_steady])
    assert [r.error.code for r in replies] == [ErrorCode.MESSAGE_UNAVAILABLE] * 2
    assert await state.get_node_ids() == [steady]


async def test_a_late_reply_is_rejected_even_before_the_reaper_runs(
    fake_clock: FakeClock,
) -> None:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        node_id = await state.create_node(heartbeat_interval=float("inf"))
        run_id = (await state.create_run({})).run_id
        await state.push_messages(run_id, [train(node_id, ttl=10.0)])
        (pulled,) = await state.pull_messages(node_id)
        fake_clock.advance(10.0)
        with pytest.raises(ReplyRejectedError):
            await state.push_reply(node_id, Message(RecordDict(), reply_to=pulled))


async def test_leaving_the_block_stops_the_reaper(fake_clock: FakeClock) -> None:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        await state.create_node(heartbeat_interval=1.0)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert fake_clock.pending_timers == 1
    assert fake_clock.pending_timers == 0


async def test_the_body_exception_leaves_the_block_unwrapped(fake_clock: FakeClock) -> None:
    with pytest.raises(KeyError):
        async with InMemoryLinkState(fake_clock):
            raise KeyError("body")
