"""The one Grid, over both channels: event-driven receive, timeouts on the injected clock,
the sync facade. ``deployed`` runs it over the link's runtime API called directly, the
service a deployed ServerApp reaches over HTTP."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable

import anyio
import anyio.to_thread
import pytest

from fedcore import ConfigRecord, Message, RecordDict, SyncGrid
from fedcore.domain import ErrorCode, Run, RunStatus
from fedcore.errors import NotEnoughNodesError
from fedcore.roles.link.runtime import LinkRuntime
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.transport.grid import LinkGrid

pytestmark = pytest.mark.anyio


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


@pytest.fixture
async def run(state: InMemoryLinkState) -> Run:
    run = await state.create_run({})
    await state.update_run_status(run.run_id, RunStatus.STARTING)
    return await state.update_run_status(run.run_id, RunStatus.RUNNING)


@pytest.fixture(params=["in_process", "deployed"])
def grid(
    request: pytest.FixtureRequest, state: InMemoryLinkState, run: Run, fake_clock: FakeClock
) -> LinkGrid:
    if request.param == "deployed":
        return LinkGrid.deployed(LinkRuntime(state, fake_clock), run, fake_clock)
    return LinkGrid.in_process(state, run, fake_clock)


def _message(node_id: int, value: int = 0) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"value": value})}), node_id, "train")


async def _answer(state: InMemoryLinkState, node_id: int, value: int) -> None:
    (message,) = await state.pull_messages(node_id)
    reply = RecordDict({"config": ConfigRecord({"value": value})})
    await state.push_reply(node_id, Message(reply, reply_to=message))


async def test_receive_yields_in_arrival_order(state: InMemoryLinkState, grid: LinkGrid) -> None:
    nodes = await state.create_nodes(3, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(n) for n in nodes])
    order = [nodes[2], nodes[0], nodes[1]]
    received: list[int] = []

    async def nodes_answer() -> None:
        for value, node_id in enumerate(order):
            await anyio.lowlevel.checkpoint()
            await _answer(state, node_id, value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(nodes_answer)
        async for reply in grid.receive(ids):
            received.append(reply.metadata.src_node_id)
    assert received == order


async def test_in_process_receive_looks_only_at_the_replies_announced(
    state: InMemoryLinkState, run: Run, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first look, a wait in process asks the state only for the replies it
    heard of: a round of n replies costs n lookups, not n² (the LinkState is in this
    process, so nothing stops it from hearing them)."""
    grid = LinkGrid.in_process(state, run, fake_clock)
    nodes = await state.create_nodes(3, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(n) for n in nodes])
    looked: list[list[str] | None] = []
    get_replies = state.get_replies

    async def spy(run_id: int, message_ids: Iterable[str] | None) -> list[Message]:
        asked = None if message_ids is None else list(message_ids)
        looked.append(asked)
        return await get_replies(run_id, asked)

    monkeypatch.setattr(state, "get_replies", spy)

    async def nodes_answer() -> None:
        for value, node_id in enumerate(nodes):
            await anyio.wait_all_tasks_blocked()
            await _answer(state, node_id, value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(nodes_answer)
        received = [reply.metadata.reply_to_message_id async for reply in grid.receive(ids)]
    assert received == ids
    assert looked == [ids, [ids[0]], [ids[1]], [ids[2]]]


async def test_replies_stored_before_receive_are_yielded(
    state: InMemoryLinkState, grid: LinkGrid
) -> None:
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(node)])
    await _answer(state, node, 7)
    replies = [reply async for reply in grid.receive(ids)]
    assert [reply.content["config"]["value"] for reply in replies] == [7]


async def test_receive_times_out_on_the_injected_clock(
    state: InMemoryLinkState, grid: LinkGrid, fake_clock: FakeClock
) -> None:
    nodes = await state.create_nodes(2, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(n) for n in nodes])
    await _answer(state, nodes[0], 1)
    replies: list[Message] = []

    async def collect() -> None:
        replies.extend([reply async for reply in grid.receive(ids, timeout=30)])

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await anyio.wait_all_tasks_blocked()
        assert len(replies) == 0
        fake_clock.advance(29)
        await anyio.wait_all_tasks_blocked()
        assert not replies
        fake_clock.advance(1)
    assert [reply.metadata.src_node_id for reply in replies] == [nodes[0]]


async def test_unknown_ids_end_with_error_replies(grid: LinkGrid) -> None:
    replies = [reply async for reply in grid.receive(["nope"])]
    assert [reply.error.code for reply in replies] == [ErrorCode.MESSAGE_UNAVAILABLE]


async def test_expired_messages_end_receive_with_errors(
    state: InMemoryLinkState, grid: LinkGrid, fake_clock: FakeClock
) -> None:
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    message = Message(RecordDict(), node, "train", ttl=10)
    ids = await grid.push_messages([message])
    replies: list[Message] = []

    async def collect() -> None:
        replies.extend([reply async for reply in grid.receive(ids)])

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(10)
    assert [reply.error.code for reply in replies] == [ErrorCode.MESSAGE_UNAVAILABLE]


async def test_pull_messages_hands_each_reply_out_once(
    state: InMemoryLinkState, grid: LinkGrid
) -> None:
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(node)])
    assert await grid.pull_messages(ids) == []
    await _answer(state, node, 3)
    (reply,) = await grid.pull_messages(ids)
    assert reply.content["config"]["value"] == 3
    (again,) = await grid.pull_messages(ids)
    assert again.error.code == ErrorCode.MESSAGE_UNAVAILABLE


async def test_push_messages_checks_its_input(state: InMemoryLinkState, grid: LinkGrid) -> None:
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    message = _message(node)
    (message_id,) = await grid.push_messages([message])
    assert message.metadata.message_id == message_id
    with pytest.raises(ValueError, match="pushed already"):
        await grid.push_messages([message])
    with pytest.raises(ValueError, match="not replies"):
        await grid.push_messages([Message(RecordDict(), reply_to=message)])
    with pytest.raises(TypeError, match="Messages"):
        await grid.push_messages([RecordDict()])  # type: ignore[list-item]


async def _serve_one(state: InMemoryLinkState, node_id: int, value: int) -> None:
    """A node that waits for one message (by notification, no polling) and answers it."""
    arrived = anyio.Event()
    with state.watch_messages(lambda _: arrived.set(), node_id):
        await arrived.wait()
    await _answer(state, node_id, value)


async def test_send_and_receive(state: InMemoryLinkState, grid: LinkGrid) -> None:
    nodes = await state.create_nodes(2, heartbeat_interval=math.inf)
    async with anyio.create_task_group() as tg:
        for value, node in enumerate(nodes):
            tg.start_soon(_serve_one, state, node, value)
        await anyio.wait_all_tasks_blocked()
        replies = await grid.send_and_receive([_message(n) for n in nodes])
    assert sorted(reply.content["config"]["value"] for reply in replies) == [0, 1]


async def test_wait_for_nodes_wakes_on_registration(
    state: InMemoryLinkState, grid: LinkGrid
) -> None:
    await state.create_nodes(1, heartbeat_interval=math.inf)
    found: list[int] = []

    async def wait() -> None:
        found.extend(await grid.wait_for_nodes(3))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert not found
        await state.create_nodes(2, heartbeat_interval=math.inf)
    assert len(found) == 3


async def test_wait_for_nodes_times_out_and_says_why(
    state: InMemoryLinkState,
    grid: LinkGrid,
    fake_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await state.create_nodes(1, heartbeat_interval=math.inf)
    caplog.set_level("INFO")
    failures: list[Exception] = []

    async def wait() -> None:
        try:
            await grid.wait_for_nodes(2, timeout=60)
        except NotEnoughNodesError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(59.9)
        await anyio.wait_all_tasks_blocked()
        assert not failures
        fake_clock.advance(0.1)
    assert [str(f) for f in failures] == ["waited 60 s for 2 nodes; only 1 came online"]
    assert "waiting for nodes: 1 of 2 online, giving up in 60 s" in caplog.text


async def test_sync_grid_blocks_in_a_worker_thread(
    state: InMemoryLinkState, grid: LinkGrid
) -> None:
    nodes = await state.create_nodes(2, heartbeat_interval=math.inf)

    def main() -> tuple[list[int], list[int]]:
        sync = SyncGrid(grid)
        assert sync.run.run_id == grid.run.run_id
        ids = sync.push_messages([_message(n) for n in sync.get_node_ids()])
        anyio.from_thread.run(_answer, state, nodes[0], 1)
        anyio.from_thread.run(_answer, state, nodes[1], 2)
        first = [r.content["config"]["value"] for r in sync.receive(ids[:1])]
        rest = [r.content["config"]["value"] for r in sync.pull_messages(ids[1:])]
        return first, rest

    first, rest = await anyio.to_thread.run_sync(main)
    assert (first, rest) == ([1], [2])
