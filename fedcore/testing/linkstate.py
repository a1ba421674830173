"""The LinkState conformance suite: the contract of its nodes, messages and replies
(:class:`~fedcore.state.base.MessageState`), as tests.

Every LinkState implementation, fedcore's own and any other, must pass it. To run it
against one, subclass :class:`LinkStateConformance` in a test module and provide the
``state`` fixture::

    import pytest

    from fedcore.testing.linkstate import PATIENCE, LinkStateConformance


    class TestMyLinkState(LinkStateConformance):
        @pytest.fixture
        async def state(self, fake_clock):
            async with MyLinkState(fake_clock, heartbeat_patience=PATIENCE) as state:
                yield state

The ``state`` fixture must yield a LinkState that

- reads time only from ``fake_clock``, the :class:`~fedcore.testing.FakeClock` fixture of
  :mod:`fedcore.testing.plugin`: the tests advance that same clock to pass TTLs, leases
  and heartbeat deadlines;
- has a heartbeat patience of :data:`PATIENCE` (2): a node is offline once
  ``2 × heartbeat_interval`` passes without a heartbeat;
- is entered (``async with``), so that its timers fire and its notifications arrive as
  the clock advances, without any further call;
- is new and empty for each test (function scope): no nodes, runs or messages.

Run pytest with ``-p fedcore.testing.plugin`` (the ``fake_clock`` fixture, asyncio in
debug mode); the tests are marked ``anyio`` and run by anyio's pytest plugin. A test
that waits for a notification gives up after :data:`NOTIFICATION_TIMEOUT` real seconds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

import anyio
import numpy as np
import pytest

from fedcore.domain import (
    SERVER_NODE_ID,
    ArrayRecord,
    ConfigRecord,
    Error,
    ErrorCode,
    Message,
    MetricRecord,
    RecordDict,
    RunStatus,
)
from fedcore.domain.lifecycle import RUN_TRANSITIONS
from fedcore.errors import (
    ConflictError,
    InvalidTransitionError,
    MessageNotFoundError,
    NodeNotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.state.base import LinkState
from fedcore.testing.clock import FakeClock
from fedcore.wire.batch import pack_batch, unpack_batch

__all__ = ["NOTIFICATION_TIMEOUT", "PATIENCE", "LinkStateConformance"]

PATIENCE = 2.0
"""The heartbeat patience the ``state`` fixture must give its LinkState."""

NOTIFICATION_TIMEOUT = 5.0
"""Real seconds a test waits for an expected notification before it fails."""

INTERVAL = 1.0
"""The heartbeat interval of the nodes the tests register."""

OFFLINE_AFTER = PATIENCE * INTERVAL
EPSILON = 0.01
LEASE = 1.0
"""Shorter than ``OFFLINE_AFTER``: a lease runs out while its node is still online."""
TTL = 30.0
MESSAGE_UNAVAILABLE = ErrorCode.MESSAGE_UNAVAILABLE  # code 3
NODE_UNAVAILABLE = ErrorCode.NODE_UNAVAILABLE  # code 5
UNKNOWN_NODE_ID = 424_242
UNKNOWN_RUN_ID = 424_242
UNKNOWN_MESSAGE_ID = "0123456789abcdef0123456789abcdef"

T = TypeVar("T")

# ---------------------------------------------------------------------- helpers


KEY_A, KEY_B = b"\x30\x2a public key of node A", b"\x30\x2a public key of node B"
"""Two public keys as the state sees them: opaque bytes (DER in a deployment)."""


def records(**config: int | str) -> RecordDict:
    return RecordDict({"config": ConfigRecord(dict(config))})


def rich_records() -> RecordDict:
    """Content with every record kind, to check that content survives intact."""
    return RecordDict(
        {
            "weights": ArrayRecord({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}),
            "metrics": MetricRecord({"loss": 0.25, "num_examples": 10, "acc": [0.5, 0.75]}),
            "config": ConfigRecord({"lr": 0.1, "name": "fit", "blob": b"\x00\xff"}),
        }
    )


def message(
    node_id: int, message_type: str = "train", *, ttl: float = TTL, group_id: str | None = None
) -> Message:
    return Message(records(x=1), node_id, message_type, ttl=ttl, group_id=group_id)


def reply(to: Message, content: RecordDict | None = None) -> Message:
    return Message(records(ok=1) if content is None else content, reply_to=to)


def error_code(message: Message) -> int | None:
    return message.error.code if message.has_error() else None


async def push(
    state: LinkState,
    run_id: int,
    node_id: int,
    message_type: str = "train",
    *,
    ttl: float = TTL,
    group_id: str | None = None,
) -> str:
    """Push one message and return its id."""
    sent = message(node_id, message_type, ttl=ttl, group_id=group_id)
    (message_id,) = await state.push_messages(run_id, [sent])
    return message_id


async def pull_one(state: LinkState, node_id: int, *, lease: float | None = None) -> Message:
    pulled = await state.pull_messages(node_id, limit=1, lease=lease)
    assert len(pulled) == 1, f"node {node_id} has nothing to pull"
    return pulled[0]


async def the_reply(state: LinkState, run_id: int, message_id: str) -> Message:
    replies = await state.get_replies(run_id, [message_id])
    assert len(replies) == 1, f"message {message_id!r} has {len(replies)} replies"
    return replies[0]


async def settle() -> None:
    """Let the state's background tasks run for a few scheduling points."""
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def advance(clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    await settle()


def _path_to(target: RunStatus) -> list[RunStatus]:
    """The moves that take a new (pending) run to ``target``, shortest first."""
    paths: dict[RunStatus, list[RunStatus]] = {RunStatus.PENDING: []}
    queue = deque([RunStatus.PENDING])
    while queue:
        current = queue.popleft()
        for nxt in sorted(RUN_TRANSITIONS[current], key=list(RunStatus).index):
            if nxt not in paths:
                paths[nxt] = [*paths[current], nxt]
                queue.append(nxt)
    return paths[target]


def _all_moves() -> Iterator[tuple[RunStatus, RunStatus]]:
    for current in RunStatus:
        for new in RunStatus:
            yield current, new


class Recorder(Generic[T]):
    """A notification callback that remembers its calls; a test can wait for one."""

    def __init__(self) -> None:
        self.calls: list[T] = []
        self._called = anyio.Event()

    def __call__(self, value: T) -> None:
        self.calls.append(value)
        self._called.set()

    async def wait_for(self, value: T) -> None:
        with anyio.move_on_after(NOTIFICATION_TIMEOUT) as scope:
            while value not in self.calls:
                self._called = anyio.Event()
                await self._called.wait()
        if scope.cancelled_caught:
            pytest.fail(
                f"no notification {value!r} within {NOTIFICATION_TIMEOUT} s; got {self.calls}"
            )


# -------------------------------------------------------------------- the suite


class LinkStateConformance:
    """The tests every LinkState must pass; a subclass provides the ``state`` fixture."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def state(self) -> LinkState:
        raise NotImplementedError(
            "a LinkStateConformance subclass must provide the `state` fixture: an entered "
            "LinkState on the `fake_clock` fixture with heartbeat patience PATIENCE"
        )

    @pytest.fixture
    async def run_id(self, state: LinkState) -> int:
        return (await state.create_run({})).run_id

    @pytest.fixture
    async def node_id(self, state: LinkState) -> int:
        return await state.create_node(heartbeat_interval=INTERVAL)

    # Nodes -------------------------------------------------------------------------

    async def test_created_node_ids_are_distinct_and_not_reserved(self, state: LinkState) -> None:
        first = await state.create_nodes(20, heartbeat_interval=INTERVAL)
        second = await state.create_nodes(5, heartbeat_interval=INTERVAL)
        ids = first + second
        assert len(first) == 20
        assert len(second) == 5
        assert len(set(ids)) == len(ids)
        assert all(isinstance(node_id, int) for node_id in ids)
        assert not {0, SERVER_NODE_ID} & set(ids)

    async def test_create_node_registers_one_online_node(self, state: LinkState) -> None:
        node_id = await state.create_node(heartbeat_interval=INTERVAL)
        assert await state.get_node_ids() == [node_id]

    async def test_node_ids_come_in_registration_order(self, state: LinkState) -> None:
        first = await state.create_nodes(3, heartbeat_interval=INTERVAL)
        (later,) = await state.create_nodes(1, heartbeat_interval=INTERVAL)
        last = await state.create_node(heartbeat_interval=INTERVAL)
        assert await state.get_node_ids() == [*first, later, last]

    async def test_create_nodes_refuses_a_negative_count(self, state: LinkState) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.create_nodes(-1, heartbeat_interval=INTERVAL)

    @pytest.mark.parametrize("interval", [0.0, -1.0, math.nan])
    async def test_create_nodes_refuses_a_bad_interval(
        self, state: LinkState, interval: float
    ) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.create_nodes(1, heartbeat_interval=interval)
        assert await state.get_node_ids() == []

    @pytest.mark.parametrize("interval", [0.0, -1.0, math.nan])
    async def test_heartbeat_refuses_a_bad_interval(
        self, state: LinkState, fake_clock: FakeClock, node_id: int, interval: float
    ) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.heartbeat(node_id, heartbeat_interval=interval)
        await advance(fake_clock, OFFLINE_AFTER - EPSILON)
        assert await state.get_node_ids() == [node_id], "a refused heartbeat changed the node"

    async def test_a_node_stays_online_for_patience_times_interval(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        await advance(fake_clock, OFFLINE_AFTER - EPSILON)
        assert await state.get_node_ids() == [node_id]

    async def test_a_node_without_heartbeats_goes_offline(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        assert await state.get_node_ids() == []

    async def test_heartbeats_keep_a_node_online(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        for _ in range(10):
            await advance(fake_clock, INTERVAL)
            await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        await advance(fake_clock, OFFLINE_AFTER - EPSILON)
        assert await state.get_node_ids() == [node_id]

    async def test_a_heartbeat_sets_the_interval_for_the_next_deadline(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        await state.heartbeat(node_id, heartbeat_interval=10.0)
        await advance(fake_clock, PATIENCE * 10.0 - EPSILON)
        assert await state.get_node_ids() == [node_id]
        await advance(fake_clock, 2 * EPSILON)
        assert await state.get_node_ids() == []

    async def test_watch_nodes_hears_a_node_come_online(self, state: LinkState) -> None:
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            node_ids = await state.create_nodes(2, heartbeat_interval=INTERVAL)
            await heard.wait_for(node_ids[0])
            await heard.wait_for(node_ids[1])

    async def test_watch_nodes_hears_a_node_go_offline(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            fake_clock.advance(OFFLINE_AFTER + EPSILON)
            await heard.wait_for(node_id)
        assert heard.calls == [node_id]

    async def test_watch_nodes_hears_going_offline_once(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        """Heartbeats that moved the deadline earlier, or repeated one, add no news."""
        node_id = await state.create_node(heartbeat_interval=5.0)
        await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            fake_clock.advance(OFFLINE_AFTER + EPSILON)
            await heard.wait_for(node_id)
            await advance(fake_clock, PATIENCE * 5.0)
            assert await state.get_node_ids() == []
        assert heard.calls == [node_id]

    async def test_a_heartbeat_revives_an_offline_node_in_its_place(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        first, second = await state.create_nodes(2, heartbeat_interval=INTERVAL)
        await advance(fake_clock, OFFLINE_AFTER - 0.5)
        await state.heartbeat(second, heartbeat_interval=INTERVAL)
        await advance(fake_clock, 1.0)
        assert await state.get_node_ids() == [second]
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            await state.heartbeat(first, heartbeat_interval=INTERVAL)
            await heard.wait_for(first)
        assert await state.get_node_ids() == [first, second]

    async def test_delete_node_removes_it_and_is_heard(
        self, state: LinkState, node_id: int
    ) -> None:
        other = await state.create_node(heartbeat_interval=INTERVAL)
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            await state.delete_node(node_id)
            await heard.wait_for(node_id)
        assert await state.get_node_ids() == [other]

    async def test_a_deleted_node_stays_deleted(self, state: LinkState, node_id: int) -> None:
        await state.delete_node(node_id)
        with pytest.raises(NodeNotFoundError):
            await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        with pytest.raises(NodeNotFoundError):
            await state.pull_messages(node_id)
        with pytest.raises(NodeNotFoundError):
            await state.delete_node(node_id)
        assert await state.get_node_ids() == []

    # Node keys --------------------------------------------------------------------

    async def test_a_key_registers_one_node_and_again_the_same(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        first = await state.register_node(KEY_A, heartbeat_interval=INTERVAL)
        other = await state.register_node(KEY_B, heartbeat_interval=INTERVAL)
        assert first != other
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        assert await state.get_node_ids() == []
        # The registration answer was lost, or the node went offline: same node, online.
        assert await state.register_node(KEY_A, heartbeat_interval=10.0) == first
        assert await state.get_node_ids() == [first]
        await advance(fake_clock, PATIENCE * 10.0 - EPSILON)
        assert await state.get_node_ids() == [first], "registering again set the interval"
        assert await state.node_with_key(KEY_A) == first
        assert await state.node_with_key(KEY_B) == other

    async def test_a_key_no_node_registered_with_is_not_found(self, state: LinkState) -> None:
        await state.create_node(heartbeat_interval=INTERVAL)  # a node without a key
        with pytest.raises(NodeNotFoundError):
            await state.node_with_key(KEY_A)

    async def test_deleting_a_node_frees_its_key(self, state: LinkState) -> None:
        first = await state.register_node(KEY_A, heartbeat_interval=INTERVAL)
        await state.delete_node(first)
        with pytest.raises(NodeNotFoundError):
            await state.node_with_key(KEY_A)
        again = await state.register_node(KEY_A, heartbeat_interval=INTERVAL)
        assert again != first
        assert await state.node_with_key(KEY_A) == again
        assert await state.get_node_ids() == [again]

    async def test_keyed_nodes_offline_long_enough_are_retired(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        retiring = await state.register_node(KEY_A, heartbeat_interval=INTERVAL)
        beating = await state.register_node(KEY_B, heartbeat_interval=INTERVAL)
        keyless = await state.create_node(heartbeat_interval=INTERVAL)
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        assert await state.get_node_ids() == []
        assert await state.retire_nodes(offline_for=10.0) == [], "offline, not for long"
        await advance(fake_clock, 10.0)
        await state.heartbeat(beating, heartbeat_interval=INTERVAL)  # back: not retired
        heard = Recorder[int]()
        with state.watch_nodes(heard):
            assert await state.retire_nodes(offline_for=10.0) == [retiring]
            await heard.wait_for(retiring)
        assert await state.retire_nodes(offline_for=10.0) == []
        with pytest.raises(NodeNotFoundError):
            await state.node_with_key(KEY_A)
        with pytest.raises(NodeNotFoundError):
            await state.heartbeat(retiring, heartbeat_interval=INTERVAL)
        again = await state.register_node(KEY_A, heartbeat_interval=INTERVAL)
        assert again not in (retiring, beating, keyless)
        assert await state.get_node_ids() == [beating, again]
        await state.heartbeat(keyless, heartbeat_interval=INTERVAL)  # never retired: no key
        assert await state.get_node_ids() == [beating, keyless, again]
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.retire_nodes(offline_for=-1.0)

    async def test_register_node_refuses_a_bad_interval(self, state: LinkState) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.register_node(KEY_A, heartbeat_interval=0.0)
        with pytest.raises(NodeNotFoundError):
            await state.node_with_key(KEY_A)

    async def test_heartbeat_from_an_unknown_node_is_refused(self, state: LinkState) -> None:
        with pytest.raises(NodeNotFoundError):
            await state.heartbeat(UNKNOWN_NODE_ID, heartbeat_interval=INTERVAL)
        assert await state.get_node_ids() == []

    async def test_deleting_an_unknown_node_is_refused(self, state: LinkState) -> None:
        with pytest.raises(NodeNotFoundError):
            await state.delete_node(UNKNOWN_NODE_ID)

    async def test_pull_by_an_unknown_node_is_refused(self, state: LinkState) -> None:
        with pytest.raises(NodeNotFoundError):
            await state.pull_messages(UNKNOWN_NODE_ID)

    async def test_a_node_with_an_infinite_interval_never_goes_offline(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        node_ids = await state.create_nodes(2, heartbeat_interval=math.inf)
        await advance(fake_clock, 1e9)
        assert await state.get_node_ids() == node_ids

    async def test_a_heartbeat_with_an_infinite_interval_keeps_a_node_online(
        self, state: LinkState, fake_clock: FakeClock, node_id: int
    ) -> None:
        await state.heartbeat(node_id, heartbeat_interval=math.inf)
        await advance(fake_clock, 1e9)
        assert await state.get_node_ids() == [node_id]

    # Runs --------------------------------------------------------------------------

    async def test_a_new_run_is_pending_with_its_config_and_seed(self, state: LinkState) -> None:
        config = {"lr": 0.1, "num-rounds": 3, "name": "mnist"}
        created = await state.create_run(config, seed=42)
        assert created.status is RunStatus.PENDING
        assert created.run_config == config
        assert created.seed == 42
        fetched = await state.get_run(created.run_id)
        assert fetched.run_id == created.run_id
        assert fetched.status is RunStatus.PENDING
        assert fetched.run_config == config
        assert fetched.seed == 42

    async def test_a_run_without_a_seed_has_none(self, state: LinkState) -> None:
        run = await state.create_run({})
        assert run.seed is None
        assert (await state.get_run(run.run_id)).seed is None

    async def test_run_ids_are_distinct(self, state: LinkState) -> None:
        run_ids = [(await state.create_run({})).run_id for _ in range(10)]
        assert len(set(run_ids)) == 10

    async def test_get_run_of_an_unknown_run_is_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.get_run(UNKNOWN_RUN_ID)

    async def test_update_of_an_unknown_run_is_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.update_run_status(UNKNOWN_RUN_ID, RunStatus.STARTING)

    @pytest.mark.parametrize(
        ("current", "new"), list(_all_moves()), ids=[f"{a}->{b}" for a, b in _all_moves()]
    )
    async def test_run_transitions_follow_the_table(
        self, state: LinkState, run_id: int, current: RunStatus, new: RunStatus
    ) -> None:
        for status in _path_to(current):
            await state.update_run_status(run_id, status)
        if new in RUN_TRANSITIONS[current]:
            assert (await state.update_run_status(run_id, new)).status is new
            assert (await state.get_run(run_id)).status is new
        else:
            with pytest.raises(InvalidTransitionError):
                await state.update_run_status(run_id, new)
            assert (await state.get_run(run_id)).status is current

    async def test_a_status_update_keeps_its_reason(self, state: LinkState, run_id: int) -> None:
        updated = await state.update_run_status(run_id, RunStatus.FAILED, "app crashed")
        assert updated.reason == "app crashed"
        assert (await state.get_run(run_id)).reason == "app crashed"

    async def test_finishing_a_run_drops_its_undelivered_messages(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await push(state, run_id, node_id)
        leased = await pull_one(state, node_id, lease=LEASE)
        await push(state, run_id, node_id)
        await state.update_run_status(run_id, RunStatus.STOPPED)
        assert await state.pull_messages(node_id) == []
        await advance(fake_clock, LEASE + EPSILON)
        assert await state.pull_messages(node_id) == [], "a dropped lease was redelivered"
        with pytest.raises(MessageNotFoundError):
            await state.push_reply(node_id, reply(leased))

    async def test_finishing_a_run_drops_its_replies(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await state.update_run_status(run_id, RunStatus.FAILED)
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE

    async def test_finishing_a_run_leaves_other_runs_alone(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        replied = await push(state, other_run, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        pending = await push(state, other_run, node_id)
        await push(state, run_id, node_id)
        await state.update_run_status(run_id, RunStatus.STOPPED)
        assert error_code(await the_reply(state, other_run, replied)) is None
        assert [m.metadata.message_id for m in await state.pull_messages(node_id)] == [pending]

    async def test_a_finished_run_takes_no_messages(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        await state.update_run_status(run_id, RunStatus.STOPPED)
        with pytest.raises(RunFinishedError):
            await push(state, run_id, node_id)
        assert await state.pull_messages(node_id) == []

    # Pushing and pulling messages ------------------------------------------------------

    async def test_push_stamps_each_message(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await advance(fake_clock, 0.5)
        messages = [message(node_id), message(node_id, "evaluate")]
        message_ids = await state.push_messages(run_id, messages)
        assert len(message_ids) == 2
        assert len(set(message_ids)) == 2
        for pushed, message_id in zip(messages, message_ids, strict=True):
            assert message_id
            assert pushed.metadata.message_id == message_id
            assert pushed.metadata.run_id == run_id
            assert pushed.metadata.src_node_id == SERVER_NODE_ID
            assert pushed.metadata.created_at == fake_clock.now()

    async def test_message_ids_are_unique_across_pushes_and_runs(
        self, state: LinkState, node_id: int
    ) -> None:
        message_ids: list[str] = []
        for _ in range(2):
            run_id = (await state.create_run({})).run_id
            for _ in range(3):
                batch = [message(node_id) for _ in range(5)]
                message_ids += await state.push_messages(run_id, batch)
        assert len(set(message_ids)) == 30

    async def test_messages_named_by_the_serverapp_are_stored_once_when_pushed_again(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        first, second = message(node_id), message(node_id, "evaluate")
        first.metadata.message_id, second.metadata.message_id = "a" * 32, "b" * 32
        assert await state.push_messages(run_id, [first]) == ["a" * 32]
        again = message(node_id)  # the same push again, after its response was lost
        again.metadata.message_id = "a" * 32
        assert await state.push_messages(run_id, [again, second]) == ["a" * 32, "b" * 32]
        pulled = await state.pull_messages(node_id)
        assert [m.metadata.message_id for m in pulled] == ["a" * 32, "b" * 32]
        assert [m.metadata.message_type for m in pulled] == ["train", "evaluate"]

    async def test_a_chosen_message_id_must_be_well_formed_and_not_another_runs(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        for bad in ("A" * 32, "a" * 31, "g" * 32, "a" * 33):
            named = message(node_id)
            named.metadata.message_id = bad
            with pytest.raises(ValueError, match="32 lowercase hex"):
                await state.push_messages(run_id, [named])
        named = message(node_id)
        named.metadata.message_id = "c" * 32
        await state.push_messages(run_id, [named])
        other_run = (await state.create_run({})).run_id
        clash = message(node_id)
        clash.metadata.message_id = "c" * 32
        with pytest.raises(ConflictError):
            await state.push_messages(other_run, [clash])
        assert [m.metadata.run_id for m in await state.pull_messages(node_id)] == [run_id]

    async def test_push_to_an_unknown_run_is_refused(self, state: LinkState, node_id: int) -> None:
        with pytest.raises(RunNotFoundError):
            await push(state, UNKNOWN_RUN_ID, node_id)
        assert await state.pull_messages(node_id) == []

    async def test_a_pulled_message_is_the_message_pushed(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await advance(fake_clock, 0.5)
        sent = message(node_id, "evaluate.final", ttl=90.0, group_id="round-7")
        sent.content = rich_records()
        (message_id,) = await state.push_messages(run_id, [sent])
        pulled = await pull_one(state, node_id)
        meta = pulled.metadata
        assert meta.message_id == message_id
        assert meta.run_id == run_id
        assert meta.src_node_id == SERVER_NODE_ID
        assert meta.dst_node_id == node_id
        assert meta.message_type == "evaluate.final"
        assert meta.group_id == "round-7"
        assert meta.ttl == 90.0
        assert meta.created_at == fake_clock.now()
        assert not pulled.is_reply
        assert pulled.content == rich_records()

    async def test_a_pulled_message_is_not_pulled_again(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        await push(state, run_id, node_id)
        await pull_one(state, node_id, lease=LEASE)
        assert await state.pull_messages(node_id, lease=LEASE) == []

    async def test_a_node_pulls_only_its_own_messages(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other = await state.create_node(heartbeat_interval=INTERVAL)
        mine = await push(state, run_id, node_id)
        theirs = await push(state, run_id, other)
        assert [m.metadata.message_id for m in await state.pull_messages(node_id)] == [mine]
        assert [m.metadata.message_id for m in await state.pull_messages(other)] == [theirs]

    async def test_pull_respects_its_limit(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_ids = await state.push_messages(run_id, [message(node_id) for _ in range(3)])
        first = await state.pull_messages(node_id, limit=2)
        assert [m.metadata.message_id for m in first] == message_ids[:2]
        rest = await state.pull_messages(node_id, limit=2)
        assert [m.metadata.message_id for m in rest] == message_ids[2:]

    async def test_pull_hands_out_the_oldest_first(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_ids = []
        for _ in range(3):
            message_ids.append(await push(state, run_id, node_id))
            await advance(fake_clock, 0.1)
        pulled = await state.pull_messages(node_id)
        assert [m.metadata.message_id for m in pulled] == message_ids

    async def test_an_expired_lease_is_redelivered_and_heard(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        await pull_one(state, node_id, lease=LEASE)
        heard = Recorder[int]()
        with state.watch_messages(heard, node_id):
            await advance(fake_clock, LEASE - EPSILON)
            assert await state.pull_messages(node_id) == []
            fake_clock.advance(2 * EPSILON)
            await heard.wait_for(node_id)
        again = await pull_one(state, node_id, lease=LEASE)
        assert again.metadata.message_id == message_id

    async def test_a_redelivered_message_keeps_its_place(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        older = await push(state, run_id, node_id)
        await pull_one(state, node_id, lease=LEASE)
        await advance(fake_clock, LEASE / 2)
        newer = await push(state, run_id, node_id)
        await advance(fake_clock, LEASE / 2 + EPSILON)
        pulled = await state.pull_messages(node_id)
        assert [m.metadata.message_id for m in pulled] == [older, newer]

    async def test_a_replied_message_is_not_redelivered(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id, lease=LEASE)))
        await advance(fake_clock, LEASE + EPSILON)
        assert await state.pull_messages(node_id) == []

    async def test_without_a_lease_a_pulled_message_waits_for_its_ttl(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        message_id = await push(state, run_id, node_id, ttl=TTL)
        await pull_one(state, node_id, lease=None)
        await advance(fake_clock, TTL - EPSILON)
        assert await state.pull_messages(node_id) == []
        assert await state.get_replies(run_id, [message_id]) == []
        await advance(fake_clock, 2 * EPSILON)
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE

    # Messages that cannot be answered -------------------------------------------------

    async def test_a_message_to_an_unknown_node_is_answered_at_once(
        self, state: LinkState, run_id: int
    ) -> None:
        heard = Recorder[str]()
        with state.watch_replies(run_id, heard):
            message_id = await push(state, run_id, UNKNOWN_NODE_ID)
            await heard.wait_for(message_id)
        answer = await the_reply(state, run_id, message_id)
        assert error_code(answer) == NODE_UNAVAILABLE
        assert answer.metadata.reply_to_message_id == message_id
        assert answer.metadata.run_id == run_id
        assert answer.metadata.dst_node_id == SERVER_NODE_ID

    async def test_a_message_to_an_offline_node_is_answered_at_once(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        message_id = await push(state, run_id, node_id)
        assert error_code(await the_reply(state, run_id, message_id)) == NODE_UNAVAILABLE
        assert await state.pull_messages(node_id) == []

    async def test_a_message_past_its_ttl_is_answered_and_heard(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        message_id = await push(state, run_id, node_id, ttl=10.0, group_id="g")
        await advance(fake_clock, 10.0 - EPSILON)
        assert await state.get_replies(run_id, [message_id]) == []
        heard = Recorder[str]()
        with state.watch_replies(run_id, heard):
            fake_clock.advance(2 * EPSILON)
            await heard.wait_for(message_id)
        answer = await the_reply(state, run_id, message_id)
        assert error_code(answer) == MESSAGE_UNAVAILABLE
        assert answer.metadata.reply_to_message_id == message_id
        assert answer.metadata.run_id == run_id
        assert answer.metadata.src_node_id == node_id
        assert answer.metadata.dst_node_id == SERVER_NODE_ID
        assert answer.metadata.group_id == "g"
        assert answer.metadata.message_type == "train"
        assert await state.pull_messages(node_id) == []

    async def test_a_node_going_offline_answers_its_open_messages(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        """Pending and leased messages get code 5; a message already replied keeps its reply."""
        replied, leased, pending = await state.push_messages(
            run_id, [message(node_id) for _ in range(3)]
        )
        await state.push_reply(node_id, reply(await pull_one(state, node_id), rich_records()))
        await pull_one(state, node_id, lease=None)
        heard = Recorder[str]()
        with state.watch_replies(run_id, heard):
            fake_clock.advance(OFFLINE_AFTER + EPSILON)
            await heard.wait_for(leased)
            await heard.wait_for(pending)
        answers = await state.get_replies(run_id, [replied, leased, pending])
        assert [error_code(a) for a in answers] == [None, NODE_UNAVAILABLE, NODE_UNAVAILABLE]
        assert answers[0].content == rich_records()
        for answer, message_id in zip(answers[1:], [leased, pending], strict=True):
            assert answer.metadata.reply_to_message_id == message_id
            assert answer.metadata.src_node_id == node_id
            assert answer.metadata.dst_node_id == SERVER_NODE_ID

    async def test_deleting_a_node_answers_its_open_messages(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        replied, leased, pending = await state.push_messages(
            run_id, [message(node_id) for _ in range(3)]
        )
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await pull_one(state, node_id, lease=LEASE)
        heard = Recorder[str]()
        with state.watch_replies(run_id, heard):
            await state.delete_node(node_id)
            await heard.wait_for(leased)
            await heard.wait_for(pending)
        answers = await state.get_replies(run_id, [replied, leased, pending])
        assert [error_code(a) for a in answers] == [None, NODE_UNAVAILABLE, NODE_UNAVAILABLE]

    async def test_fedcores_answer_never_outlives_its_message(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        """An error reply is stamped as a node's reply is: when it was made, with a ttl
        bounded by what remained of its message's."""
        node_id = await state.create_node(heartbeat_interval=math.inf)
        message_id = await push(state, run_id, node_id, ttl=100.0, group_id="g")
        sent = await pull_one(state, node_id)
        await advance(fake_clock, 40.0)
        await state.delete_node(node_id)
        answer = await the_reply(state, run_id, message_id)
        assert error_code(answer) == NODE_UNAVAILABLE
        meta = answer.metadata
        assert meta.created_at == pytest.approx(sent.metadata.created_at + 40.0, abs=1e-6)
        assert meta.expires_at == pytest.approx(sent.metadata.expires_at, abs=1e-6)
        assert (meta.run_id, meta.group_id, meta.message_type) == (run_id, "g", "train")
        assert meta.message_id not in ("", message_id)

    async def test_a_node_going_offline_spares_other_nodes_messages(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        steady = await state.create_node(heartbeat_interval=math.inf)
        await push(state, run_id, node_id)
        steady_message = await push(state, run_id, steady)
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        assert await state.get_replies(run_id, [steady_message]) == []
        assert (await pull_one(state, steady)).metadata.message_id == steady_message

    async def test_a_revived_node_gets_new_messages(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        message_id = await push(state, run_id, node_id)
        assert (await pull_one(state, node_id)).metadata.message_id == message_id
        assert await state.get_replies(run_id, [message_id]) == []

    # Replies -------------------------------------------------------------------------

    async def test_a_reply_is_stored_as_pushed(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        reply_id = await state.push_reply(
            node_id, reply(await pull_one(state, node_id), rich_records())
        )
        answer = await the_reply(state, run_id, message_id)
        assert answer.metadata.message_id == reply_id
        assert answer.content == rich_records()

    async def test_a_reply_is_stamped(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id, message_type="query.stats", group_id="g1")
        pulled = await pull_one(state, node_id)
        await advance(fake_clock, 1.0)
        reply_id = await state.push_reply(node_id, reply(pulled))
        meta = (await the_reply(state, run_id, message_id)).metadata
        assert reply_id
        assert reply_id != message_id
        assert meta.message_id == reply_id
        assert meta.reply_to_message_id == message_id
        assert meta.src_node_id == node_id
        assert meta.dst_node_id == SERVER_NODE_ID
        assert meta.run_id == run_id
        assert meta.group_id == "g1"
        assert meta.message_type == "query.stats"

    async def test_a_reply_never_outlives_its_message(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id, ttl=5.0)
        pulled = await pull_one(state, node_id)
        await advance(fake_clock, 1.5)
        await state.push_reply(node_id, reply(pulled))
        meta = (await the_reply(state, run_id, message_id)).metadata
        assert meta.created_at + meta.ttl == pytest.approx(pulled.metadata.expires_at, abs=1e-6)

    async def test_a_reply_is_stamped_from_its_message_not_from_itself(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        """What the reply says about its sender, run and group is ignored: the sender is
        the authenticated ``node_id``, the rest comes from the message it answers."""
        message_id = await push(state, run_id, node_id, group_id="g1")
        answer = reply(await pull_one(state, node_id))
        answer.metadata.src_node_id = UNKNOWN_NODE_ID
        answer.metadata.dst_node_id = UNKNOWN_NODE_ID
        answer.metadata.run_id = UNKNOWN_RUN_ID
        answer.metadata.group_id = "forged"
        await state.push_reply(node_id, answer)
        meta = (await the_reply(state, run_id, message_id)).metadata
        assert (meta.src_node_id, meta.dst_node_id) == (node_id, SERVER_NODE_ID)
        assert (meta.run_id, meta.group_id) == (run_id, "g1")

    async def test_an_error_reply_from_a_node_is_stored(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        failure = Error(int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION), "ZeroDivisionError")
        await state.push_reply(node_id, Message(error=failure, reply_to=pulled))
        assert (await the_reply(state, run_id, message_id)).error == failure

    async def test_get_replies_answers_in_the_order_asked(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        """Messages without a reply yet are left out; the others come in the order asked."""
        first, unanswered, third = await state.push_messages(
            run_id, [message(node_id) for _ in range(3)]
        )
        pulled = {m.metadata.message_id: m for m in await state.pull_messages(node_id)}
        await state.push_reply(node_id, reply(pulled[third], records(n=3)))
        await state.push_reply(node_id, reply(pulled[first], records(n=1)))
        answers = await state.get_replies(run_id, [third, unanswered, first])
        assert [a.metadata.reply_to_message_id for a in answers] == [third, first]
        assert [a.content["config"]["n"] for a in answers] == [3, 1]

    async def test_get_replies_without_ids_gives_every_reply_held_in_the_order_stored(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        """``None``, Flower's "pull any": the run's replies not yet acknowledged, oldest
        first, without consuming them; unanswered messages and other runs' replies are
        left out, and an unknown id cannot be asked for, so none is made up."""
        first, unanswered, third, acked = await state.push_messages(
            run_id, [message(node_id) for _ in range(4)]
        )
        other_run = (await state.create_run({})).run_id
        await push(state, other_run, node_id)
        pulled = {m.metadata.message_id: m for m in await state.pull_messages(node_id)}
        assert await state.get_replies(run_id, None) == []
        for answered in (acked, third):
            await state.push_reply(node_id, reply(pulled[answered]))
            await advance(fake_clock, 0.1)
        unreachable = await push(state, run_id, UNKNOWN_NODE_ID)  # answered at once
        await advance(fake_clock, 0.1)
        await state.push_reply(node_id, reply(pulled[first]))
        for held in pulled.values():
            if held.metadata.run_id == other_run:
                await state.push_reply(node_id, reply(held))
        await state.ack_replies(run_id, [acked])
        for _ in range(2):
            answers = await state.get_replies(run_id, None)
            assert [a.metadata.reply_to_message_id for a in answers] == [
                third,
                unreachable,
                first,
            ]
        assert error_code(answers[1]) == NODE_UNAVAILABLE
        assert all(a.metadata.run_id == run_id for a in answers)
        assert unanswered not in {a.metadata.reply_to_message_id for a in answers}
        with pytest.raises(RunNotFoundError):
            await state.get_replies(UNKNOWN_RUN_ID, None)

    async def test_get_replies_does_not_consume(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        first = await the_reply(state, run_id, message_id)
        again = await the_reply(state, run_id, message_id)
        assert again.metadata.message_id == first.metadata.message_id

    async def test_an_identical_retry_is_idempotent(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        pushed, repeated = reply(pulled, rich_records()), reply(pulled, rich_records())
        first = await state.push_reply(node_id, pushed)
        retry = await state.push_reply(node_id, repeated)
        assert retry == first
        # The first push is stamped with its id; the retry is left as it came.
        assert (pushed.metadata.message_id, repeated.metadata.message_id) == (first, "")
        answers = await state.get_replies(run_id, [message_id])
        assert [a.metadata.message_id for a in answers] == [first]

    async def test_an_identical_error_retry_is_idempotent(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        failure = Error(int(ErrorCode.CLIENT_APP_CRASHED), "exit code -9")
        first = await state.push_reply(node_id, Message(error=failure, reply_to=pulled))
        assert await state.push_reply(node_id, Message(error=failure, reply_to=pulled)) == first

    async def test_a_different_retry_conflicts(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        await state.push_reply(node_id, reply(pulled, records(n=1)))
        with pytest.raises(ConflictError):
            await state.push_reply(node_id, reply(pulled, records(n=2)))
        with pytest.raises(ConflictError):
            await state.push_reply(node_id, Message(error=Error(2, "boom"), reply_to=pulled))
        assert (await the_reply(state, run_id, message_id)).content == records(n=1)

    async def test_a_reply_from_another_node_is_not_found(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        """To a node that is not its destination, a message does not exist."""
        intruder = await state.create_node(heartbeat_interval=INTERVAL)
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        with pytest.raises(MessageNotFoundError):
            await state.push_reply(intruder, reply(pulled))
        assert await state.get_replies(run_id, [message_id]) == []
        await state.push_reply(node_id, reply(pulled))
        with pytest.raises(MessageNotFoundError):
            await state.push_reply(intruder, reply(pulled))

    async def test_a_reply_to_an_unknown_message_is_not_found(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        await push(state, run_id, node_id)
        answer = reply(await pull_one(state, node_id))
        answer.metadata.reply_to_message_id = UNKNOWN_MESSAGE_ID
        with pytest.raises(MessageNotFoundError):
            await state.push_reply(node_id, answer)

    async def test_a_reply_of_another_type_is_rejected(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id, message_type="train")
        answer = reply(await pull_one(state, node_id))
        answer.metadata.message_type = "evaluate"
        with pytest.raises(ReplyRejectedError):
            await state.push_reply(node_id, answer)
        assert await state.get_replies(run_id, [message_id]) == []

    async def test_a_reply_after_the_ttl_is_rejected(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        message_id = await push(state, run_id, node_id, ttl=10.0)
        pulled = await pull_one(state, node_id)
        await advance(fake_clock, 10.0 + EPSILON)
        with pytest.raises(ReplyRejectedError):
            await state.push_reply(node_id, reply(pulled))
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE

    async def test_a_reply_after_going_offline_is_rejected(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id)
        await advance(fake_clock, OFFLINE_AFTER + EPSILON)
        await state.heartbeat(node_id, heartbeat_interval=INTERVAL)
        with pytest.raises(ReplyRejectedError):
            await state.push_reply(node_id, reply(pulled))
        assert error_code(await the_reply(state, run_id, message_id)) == NODE_UNAVAILABLE

    async def test_get_replies_answers_an_unknown_id_with_an_error(
        self, state: LinkState, run_id: int
    ) -> None:
        answer = await the_reply(state, run_id, UNKNOWN_MESSAGE_ID)
        assert error_code(answer) == MESSAGE_UNAVAILABLE
        assert answer.metadata.reply_to_message_id == UNKNOWN_MESSAGE_ID
        assert answer.metadata.run_id == run_id

    async def test_another_runs_message_looks_unknown(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        message_id = await push(state, other_run, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        answer = await the_reply(state, run_id, message_id)
        assert error_code(answer) == MESSAGE_UNAVAILABLE
        assert answer.metadata.run_id == run_id

    async def test_an_id_already_received_is_answered_as_the_wire_carries_it(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        """A ServerApp loop pulling ids it already has gets code 3 in both runtimes.

        The simulation hands this answer over as it is; deployment packs it in a
        batch. So it must be a message the batch encoder takes: a ``system`` reply,
        since the state no longer knows the message (nor its type) it answers.
        """
        received = await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await state.ack_replies(run_id, [received])
        answers = await state.get_replies(run_id, [received, UNKNOWN_MESSAGE_ID])
        for answer, asked in zip(answers, [received, UNKNOWN_MESSAGE_ID], strict=True):
            assert error_code(answer) == MESSAGE_UNAVAILABLE
            assert answer.metadata.message_type == "system"
            assert answer.metadata.reply_to_message_id == asked
        carried = unpack_batch(pack_batch(answers))
        assert [(m.metadata, m.error) for m in carried] == [(m.metadata, m.error) for m in answers]

    async def test_get_replies_of_an_unknown_run_is_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.get_replies(UNKNOWN_RUN_ID, [UNKNOWN_MESSAGE_ID])

    # Acknowledging replies --------------------------------------------------------------

    async def test_ack_deletes_the_reply_and_its_message(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        pulled = await pull_one(state, node_id, lease=LEASE)
        await state.push_reply(node_id, reply(pulled))
        await state.ack_replies(run_id, [message_id])
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE
        await advance(fake_clock, LEASE + EPSILON)
        assert await state.pull_messages(node_id) == []
        with pytest.raises(MessageNotFoundError):
            await state.push_reply(node_id, reply(pulled))

    async def test_ack_deletes_only_what_it_names(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        acked, kept = await state.push_messages(run_id, [message(node_id), message(node_id)])
        for pulled in await state.pull_messages(node_id):
            await state.push_reply(node_id, reply(pulled))
        await state.ack_replies(run_id, [acked])
        assert error_code(await the_reply(state, run_id, kept)) is None

    async def test_an_error_reply_can_be_acknowledged(self, state: LinkState, run_id: int) -> None:
        message_id = await push(state, run_id, UNKNOWN_NODE_ID)
        assert error_code(await the_reply(state, run_id, message_id)) == NODE_UNAVAILABLE
        await state.ack_replies(run_id, [message_id])
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE

    async def test_ack_before_a_reply_is_refused(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        message_id = await push(state, run_id, node_id)
        with pytest.raises(InvalidTransitionError):
            await state.ack_replies(run_id, [message_id])
        pulled = await pull_one(state, node_id)
        with pytest.raises(InvalidTransitionError):
            await state.ack_replies(run_id, [message_id])
        await state.push_reply(node_id, reply(pulled))
        assert error_code(await the_reply(state, run_id, message_id)) is None

    async def test_a_refused_ack_changes_nothing(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        replied, unreplied = await state.push_messages(run_id, [message(node_id), message(node_id)])
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        with pytest.raises(InvalidTransitionError):
            await state.ack_replies(run_id, [replied, unreplied])
        assert error_code(await the_reply(state, run_id, replied)) is None

    async def test_ack_is_idempotent(self, state: LinkState, run_id: int, node_id: int) -> None:
        message_id = await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await state.ack_replies(run_id, [message_id, message_id])
        await state.ack_replies(run_id, [message_id, UNKNOWN_MESSAGE_ID])
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE

    async def test_ack_of_another_runs_message_does_nothing(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        message_id = await push(state, other_run, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await state.ack_replies(run_id, [message_id])
        assert error_code(await the_reply(state, other_run, message_id)) is None

    async def test_ack_of_an_unknown_run_is_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.ack_replies(UNKNOWN_RUN_ID, [UNKNOWN_MESSAGE_ID])

    # Notifications ---------------------------------------------------------------

    async def test_watch_replies_hears_a_reply_of_its_run_only(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        heard = Recorder[str]()
        with state.watch_replies(run_id, heard):
            other_message = await push(state, other_run, node_id)
            await state.push_reply(node_id, reply(await pull_one(state, node_id)))
            message_id = await push(state, run_id, node_id)
            await settle()
            assert heard.calls == []
            await state.push_reply(node_id, reply(await pull_one(state, node_id)))
            await heard.wait_for(message_id)
            await push(state, other_run, UNKNOWN_NODE_ID)
            await settle()
        assert heard.calls == [message_id]
        assert other_message not in heard.calls

    async def test_watch_messages_for_a_node_hears_only_that_node(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other = await state.create_node(heartbeat_interval=INTERVAL)
        heard = Recorder[int]()
        with state.watch_messages(heard, node_id):
            await push(state, run_id, other)
            await push(state, run_id, node_id)
            await heard.wait_for(node_id)
            await settle()
        assert set(heard.calls) == {node_id}

    async def test_watch_messages_without_a_node_hears_every_node(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        other = await state.create_node(heartbeat_interval=INTERVAL)
        heard = Recorder[int]()
        with state.watch_messages(heard):
            await push(state, run_id, other)
            await push(state, run_id, node_id)
            await heard.wait_for(other)
            await heard.wait_for(node_id)

    async def test_a_closed_subscription_hears_nothing(
        self, state: LinkState, run_id: int, node_id: int
    ) -> None:
        messages, replies, nodes = Recorder[int](), Recorder[str](), Recorder[int]()
        for subscription in [
            state.watch_messages(messages),
            state.watch_replies(run_id, replies),
            state.watch_nodes(nodes),
        ]:
            subscription.close()
        await push(state, run_id, node_id)
        await state.push_reply(node_id, reply(await pull_one(state, node_id)))
        await state.create_node(heartbeat_interval=INTERVAL)
        await settle()
        assert (messages.calls, replies.calls, nodes.calls) == ([], [], [])
