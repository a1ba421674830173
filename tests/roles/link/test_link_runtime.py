"""The link's runtime API over a LinkState, and the LinkGrid a deployed ServerApp uses."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from fedcore import ConfigRecord, Grid, Message, RecordDict
from fedcore.domain import ErrorCode, Run, RunStatus
from fedcore.errors import (
    InvalidTransitionError,
    LinkUnavailableError,
    NotEnoughNodesError,
    RunNotFoundError,
    ValueTooLargeError,
)
from fedcore.roles.link.runtime import LinkRuntime
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock
from fedcore.transport.grid import LinkGrid
from fedcore.transport.http import HttpRuntimeClient, runtime_app, serve_http

pytestmark = pytest.mark.anyio


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


@pytest.fixture
async def claimed(state: InMemoryLinkState) -> tuple[Run, str]:
    await state.create_run({"k": 1})
    (claim,) = await state.claim_runs(limit=1, lease=10.0)
    run = await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=100.0)
    return run, claim.secret


@pytest.fixture
def runtime(state: InMemoryLinkState, fake_clock: FakeClock) -> LinkRuntime:
    return LinkRuntime(state, fake_clock)


def _message(node_id: int, value: int) -> Message:
    return Message(RecordDict({"config": ConfigRecord({"v": value})}), node_id, "train")


async def test_only_the_launch_secret_authenticates(
    runtime: LinkRuntime, claimed: tuple[Run, str]
) -> None:
    run, secret = claimed
    assert (await runtime.authenticate(run.run_id, secret)).run_id == run.run_id
    for run_id, guess in [(run.run_id, "wrong"), (run.run_id + 1, secret)]:
        with pytest.raises(RunNotFoundError):
            await runtime.authenticate(run_id, guess)


async def test_pull_replies_waits_for_the_first_reply(
    runtime: LinkRuntime, state: InMemoryLinkState, claimed: tuple[Run, str]
) -> None:
    run, _ = claimed
    node = await state.create_node(heartbeat_interval=math.inf)
    ids = await runtime.push_messages(run.run_id, [_message(node, 1)])
    got: list[list[Message]] = []

    async def pull() -> None:
        got.append(await runtime.pull_replies(run.run_id, ids, wait_seconds=30.0))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(pull)
        await anyio.wait_all_tasks_blocked()
        assert not got
        (message,) = await state.pull_messages(node)
        await state.push_reply(node, Message(RecordDict(), reply_to=message))
    assert [r.metadata.reply_to_message_id for r in got[0]] == ids
    # Not acknowledged yet: a lost response is pulled again.
    assert len(await runtime.pull_replies(run.run_id, ids)) == 1
    await runtime.ack_replies(run.run_id, ids)
    (gone,) = await runtime.pull_replies(run.run_id, ids)
    assert gone.has_error()


async def test_get_node_ids_waits_for_enough_nodes(
    runtime: LinkRuntime, state: InMemoryLinkState, claimed: tuple[Run, str], fake_clock: FakeClock
) -> None:
    run, _ = claimed
    got: list[list[int]] = []

    async def wait() -> None:
        got.append(await runtime.get_node_ids(run.run_id, at_least=2, wait_seconds=5.0))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait)
        await state.create_node(heartbeat_interval=math.inf)
        await anyio.wait_all_tasks_blocked()
        assert not got
        await state.create_node(heartbeat_interval=math.inf)
    assert len(got[0]) == 2
    assert len(await runtime.get_node_ids(run.run_id, at_least=5, wait_seconds=0.0)) == 2


async def test_finish_by_the_serverapp_and_a_finished_run_is_left_as_is(
    runtime: LinkRuntime, claimed: tuple[Run, str]
) -> None:
    run, _ = claimed
    with pytest.raises(InvalidTransitionError):
        await runtime.finish(run.run_id, RunStatus.STOPPED)
    done = await runtime.finish(run.run_id, RunStatus.COMPLETED)
    assert done.status is RunStatus.COMPLETED
    again = await runtime.finish(run.run_id, RunStatus.FAILED, "late")
    assert (again.status, again.reason) == (RunStatus.COMPLETED, "")


async def test_context_round_trips(runtime: LinkRuntime, claimed: tuple[Run, str]) -> None:
    run, _ = claimed
    assert dict(await runtime.load_context(run.run_id)) == {}
    state = RecordDict({"c": ConfigRecord({"round": 3})})
    await runtime.save_context(run.run_id, state)
    assert (await runtime.load_context(run.run_id))["c"]["round"] == 3


async def test_the_runtime_grid_sends_and_receives_through_the_service(
    runtime: LinkRuntime, state: InMemoryLinkState, claimed: tuple[Run, str], fake_clock: FakeClock
) -> None:
    run, _ = claimed
    grid = LinkGrid.deployed(runtime, run, fake_clock)
    nodes = await state.create_nodes(3, heartbeat_interval=math.inf)
    assert sorted(await grid.wait_for_nodes(3, timeout=1.0)) == sorted(nodes)

    async def answer() -> None:
        for value, node in enumerate(reversed(nodes)):
            await anyio.wait_all_tasks_blocked()  # the grid waits for each reply in turn
            (message,) = await state.pull_messages(node)
            reply = RecordDict({"config": ConfigRecord({"v": value})})
            await state.push_reply(node, Message(reply, reply_to=message))

    async with anyio.create_task_group() as tasks:
        messages = [_message(node, 0) for node in nodes]
        ids = await grid.push_messages(messages)
        assert [m.metadata.message_id for m in messages] == ids
        tasks.start_soon(answer)
        replies = [reply async for reply in grid.receive(ids)]
    assert [r.metadata.src_node_id for r in replies] == list(reversed(nodes))
    # Acknowledged once received: the state holds them no more.
    assert all(r.has_error() for r in await state.get_replies(run.run_id, ids))


async def test_the_runtime_grid_refuses_a_push_with_a_value_over_its_cap(
    runtime: LinkRuntime, state: InMemoryLinkState, claimed: tuple[Run, str], fake_clock: FakeClock
) -> None:
    run, _ = claimed
    cap = 1000
    grid = LinkGrid.deployed(runtime, run, fake_clock, max_value_len=cap)
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    fits = Message(RecordDict({"c": ConfigRecord({"s": "x" * cap})}), node, "train")
    over = Message(RecordDict({"c": ConfigRecord({"b": b"x" * (cap + 1)})}), node, "train")
    with pytest.raises(ValueTooLargeError) as refused:
        await grid.push_messages([fits, over])
    assert str(refused.value) == (
        f"config record 'c' holds {cap + 1} bytes of bytes in 'b', over the cap of {cap} bytes "
        "on one value (the deployment's cap: fedcore serve --max-value-bytes, of the link and "
        "its nodes)"
    )
    assert await state.pull_messages(node) == [], "nothing of the batch was sent"
    (message_id,) = await grid.push_messages([fits])
    (pushed,) = await state.pull_messages(node)
    assert pushed.metadata.message_id == message_id


async def test_the_runtime_grid_gives_up_waiting_for_nodes_at_its_timeout(
    runtime: LinkRuntime, claimed: tuple[Run, str], fake_clock: FakeClock
) -> None:
    run, _ = claimed
    grid = LinkGrid.deployed(runtime, run, fake_clock, long_poll=1.0)
    async with anyio.create_task_group() as tasks:

        async def tick() -> None:
            while True:
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(0.5)

        tasks.start_soon(tick)
        start = fake_clock.now()
        with pytest.raises(NotEnoughNodesError):
            await grid.wait_for_nodes(1, timeout=3.0)
        assert 3.0 <= fake_clock.now() - start <= 3.5
        tasks.cancel_scope.cancel()


class _Flaky(LinkRuntime):
    """Unavailable for the first ``failures`` calls of get_node_ids."""

    def __init__(self, state: InMemoryLinkState, clock: FakeClock, failures: int) -> None:
        super().__init__(state, clock)
        self.failures = failures

    async def get_node_ids(
        self, run_id: int, *, at_least: int = 0, wait_seconds: float = 0.0
    ) -> list[int]:
        if self.failures:
            self.failures -= 1
            raise LinkUnavailableError("link restarting")
        return await super().get_node_ids(run_id, at_least=at_least, wait_seconds=wait_seconds)


async def test_the_runtime_grid_rides_out_a_link_restart_within_its_patience(
    state: InMemoryLinkState, claimed: tuple[Run, str], fake_clock: FakeClock
) -> None:
    run, _ = claimed
    async with anyio.create_task_group() as tasks:

        async def tick() -> None:
            while True:
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(1.0)

        tasks.start_soon(tick)
        grid = LinkGrid.deployed(_Flaky(state, fake_clock, failures=5), run, fake_clock)
        assert await grid.get_node_ids() == []
        impatient = LinkGrid.deployed(
            _Flaky(state, fake_clock, failures=1000), run, fake_clock, link_patience=10.0
        )
        with pytest.raises(LinkUnavailableError):
            await impatient.get_node_ids()
        tasks.cancel_scope.cancel()


async def test_a_checked_secret_is_remembered_until_its_run_changes(
    state: InMemoryLinkState, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = LinkRuntime(state, fake_clock)
    checks: list[int] = []
    check = state.check_run_secret

    async def counted(run_id: int, secret: str) -> Run:
        checks.append(run_id)
        return await check(run_id, secret)

    monkeypatch.setattr(state, "check_run_secret", counted)
    await state.create_run({})
    (claim,) = await state.claim_runs(limit=1, lease=5.0)
    for _ in range(3):
        assert (
            await runtime.authenticate(claim.run.run_id, claim.secret)
        ).run_id == claim.run.run_id
    assert len(checks) == 1
    with pytest.raises(RunNotFoundError):
        await runtime.authenticate(claim.run.run_id, "not the secret")
    fake_clock.advance(5.1)  # the claim runs out: the run is pending again, its secret void
    await anyio.wait_all_tasks_blocked()
    with pytest.raises(RunNotFoundError):
        await runtime.authenticate(claim.run.run_id, claim.secret)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_pulling_ids_already_received_answers_code_3_as_the_simulation_does(
    kind: str, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """A Flower-style loop pulls ids whose replies it has: code 3, in deployment too.

    The deployed grid goes through the runtime API over HTTP on loopback; the
    simulation's grid calls the same state directly. Both must answer alike.
    """
    opened: InMemoryLinkState | SqliteLinkState = (
        InMemoryLinkState(fake_clock, seed=0)
        if kind == "memory"
        else SqliteLinkState(tmp_path / "link.db", fake_clock, seed=0)
    )
    async with opened as state, serve_http(runtime_app(LinkRuntime(state, fake_clock))) as port:
        node = await state.create_node(heartbeat_interval=math.inf)
        answers = []
        for deployed in (True, False):
            await state.create_run({})
            (claim,) = await state.claim_runs(limit=1, lease=10.0)
            run = await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=100.0)
            async with HttpRuntimeClient("127.0.0.1", port, secret=claim.secret) as client:
                grid: Grid = (
                    LinkGrid.deployed(client, run, fake_clock)
                    if deployed
                    else LinkGrid.in_process(state, run, fake_clock)
                )
                (message_id,) = await grid.push_messages([_message(node, 1)])
                (pulled,) = await state.pull_messages(node)
                await state.push_reply(node, Message(RecordDict(), reply_to=pulled))
                (received,) = [reply async for reply in grid.receive([message_id])]
                assert not received.has_error()
                (again,) = await grid.pull_messages([message_id])
            assert again.metadata.reply_to_message_id == message_id
            answers.append((again.error.code, again.metadata.message_type))
    assert answers == [(ErrorCode.MESSAGE_UNAVAILABLE, "system")] * 2


@pytest.mark.parametrize("deployed", [True, False], ids=["deployed", "in_process"])
async def test_replies_are_stamped_when_the_grid_hands_them_over(
    runtime: LinkRuntime,
    state: InMemoryLinkState,
    claimed: tuple[Run, str],
    fake_clock: FakeClock,
    deployed: bool,
) -> None:
    run, _ = claimed
    grid: Grid = (
        LinkGrid.deployed(runtime, run, fake_clock)
        if deployed
        else LinkGrid.in_process(state, run, fake_clock)
    )
    (node,) = await state.create_nodes(1, heartbeat_interval=math.inf)
    ids = await grid.push_messages([_message(node, 1), _message(node, 2)])
    for message in await state.pull_messages(node):
        await state.push_reply(node, Message(RecordDict(), reply_to=message))
    fake_clock.advance(90.5)
    (first,) = await grid.pull_messages(ids[:1])
    fake_clock.advance(1.0)
    (second,) = [reply async for reply in grid.receive(ids[1:])]
    start = fake_clock.now() - 91.5
    for reply, seconds in ((first, 90.5), (second, 91.5)):
        assert datetime.fromisoformat(reply.metadata.delivered_at) == datetime.fromtimestamp(
            start + seconds, UTC
        )


async def test_pull_replies_without_ids_waits_for_any_reply_of_its_run(
    runtime: LinkRuntime, state: InMemoryLinkState, claimed: tuple[Run, str]
) -> None:
    """Another run's reply does not wake it; its own run's first reply does."""
    run, _ = claimed
    node = await state.create_node(heartbeat_interval=math.inf)
    other = await state.create_run({})
    await state.push_messages(other.run_id, [_message(node, 0)])
    (message_id,) = await runtime.push_messages(run.run_id, [_message(node, 1)])
    got: list[list[Message]] = []

    async def pull() -> None:
        got.append(await runtime.pull_replies(run.run_id, None, wait_seconds=30.0))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(pull)
        await anyio.wait_all_tasks_blocked()
        theirs, ours = await state.pull_messages(node)
        await state.push_reply(node, Message(RecordDict(), reply_to=theirs))
        await anyio.wait_all_tasks_blocked()
        assert not got
        await state.push_reply(node, Message(RecordDict(), reply_to=ours))
    assert [r.metadata.reply_to_message_id for r in got[0]] == [message_id]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("deployed", [True, False], ids=["deployed", "in_process"])
async def test_pulling_without_ids_hands_out_every_reply_once_in_both_grids(
    kind: str, deployed: bool, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """Flower 1.43's "pull any": the replies that arrived, oldest first, each once; the
    deprecated ``message_ids=`` still pulls, with a DeprecationWarning; both names at
    once are a TypeError. The deployed grid goes through HTTP on loopback."""
    opened: InMemoryLinkState | SqliteLinkState = (
        InMemoryLinkState(fake_clock, seed=0)
        if kind == "memory"
        else SqliteLinkState(tmp_path / "link.db", fake_clock, seed=0)
    )
    async with opened as state, serve_http(runtime_app(LinkRuntime(state, fake_clock))) as port:
        node = await state.create_node(heartbeat_interval=math.inf)
        await state.create_run({})
        (claim,) = await state.claim_runs(limit=1, lease=10.0)
        run = await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=100.0)
        bystander = await state.create_run({})  # its reply is not this run's to take
        await state.push_messages(bystander.run_id, [_message(node, 0)])
        async with HttpRuntimeClient("127.0.0.1", port, secret=claim.secret) as client:
            grid: Grid = (
                LinkGrid.deployed(client, run, fake_clock)
                if deployed
                else LinkGrid.in_process(state, run, fake_clock)
            )
            ids = await grid.push_messages([_message(node, value) for value in (1, 2, 3)])
            theirs, *ours = await state.pull_messages(node)
            pulled = {m.metadata.message_id: m for m in ours}
            assert await grid.pull_messages() == []
            for message_id in (ids[1], ids[0]):
                await state.push_reply(node, Message(RecordDict(), reply_to=pulled[message_id]))
                fake_clock.advance(0.5)
            await state.push_reply(node, Message(RecordDict(), reply_to=theirs))
            first = await grid.pull_messages()
            assert [r.metadata.reply_to_message_id for r in first] == [ids[1], ids[0]]
            assert all(r.metadata.delivered_at for r in first)
            assert await grid.pull_messages() == []
            assert await grid.pull_messages([]) == []
            await state.push_reply(node, Message(RecordDict(), reply_to=pulled[ids[2]]))
            with pytest.warns(DeprecationWarning, match="reply_to_message_ids") as warned:
                (last,) = await grid.pull_messages(message_ids=[ids[2]])
            assert warned[0].filename == __file__  # it points at the caller
            assert last.metadata.reply_to_message_id == ids[2]
            with pytest.raises(TypeError, match="not both"):
                await grid.pull_messages([ids[2]], message_ids=[ids[2]])
            assert await state.get_replies(run.run_id, None) == []
        assert len(await state.get_replies(bystander.run_id, None)) == 1
