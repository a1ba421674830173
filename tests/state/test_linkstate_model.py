"""A model-based test: random interleavings against both LinkStates at once (RELIABILITY.md).

A hypothesis state machine drives an InMemoryLinkState and a SqliteLinkState (on a file)
through the same random steps: nodes register, heartbeat, fall silent and are deleted;
messages are pushed (also to unknown nodes), pulled under leases that nodes renew,
answered, answered again (the same reply, as after a lost response, or a different one)
and acknowledged;
the clock moves past leases, TTLs and heartbeat deadlines; the SQLite state is closed
and reopened on its file. After every step it checks, on each state, the promises of
DESIGN.md §5:

- at most one reply per message: once seen, a message's reply never changes, and it
  is announced (``watch_replies``) exactly once (R3);
- a message past its TTL has its reply, from its node or from fedcore (R1, R4);
- a reply a node pushed successfully is served until acknowledged, restarts and all (R2);
- an acknowledged reply is gone, and a refused acknowledgement deletes nothing;

and that both states agree on everything a caller sees — outcomes, error codes,
contents, times, the messages a pull hands out, the nodes online, the notifications —
ids aside.

Timers of different kinds never fall due at the same instant: the clock moves in
quarter seconds and nodes heartbeat every second, so heartbeat deadlines land on
quarter seconds, while TTLs (3.1, 6.3 s) and leases (0.7, 1.15 s) end elsewhere. The
order in which timers due at the same instant fire is left open by the interface, so
a tie could make the two implementations differ without either being wrong.

Reopening the SQLite file gives each online node a fresh patience window (the link's
downtime is not the node's silence). The in-memory state cannot restart, so at that
step it gets the equivalent: a heartbeat from each online node.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fedcore.domain import ConfigRecord, Error, ErrorCode, Message, RecordDict
from fedcore.errors import (
    ConflictError,
    FedcoreError,
    InvalidTransitionError,
    MessageNotFoundError,
    NodeNotFoundError,
    ReplyRejectedError,
)
from fedcore.state.base import LinkState
from fedcore.state.memory import InMemoryLinkState
from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock

T = TypeVar("T")

PATIENCE = 2.0
KINDS = {"steady": 1.0, "flaky": 1.0, "immortal": math.inf}
"""Heartbeat intervals. Steady nodes heartbeat whenever the clock moves, flaky ones only
when a step says so, immortal ones (as in simulation) never need to. Hypothesis favours
the first of each list, so each starts with the case that leads furthest."""
TTLS = (3.1, 6.3)
LEASES = (0.7, 1.15, None)
QUARTER = 0.25
STEPS = (QUARTER, 1.0, 7.0)
"""Clock moves; the longest passes every TTL."""
UNKNOWN_NODE = 424_242
VARIANTS = ("a", "b", "error")
MEMORY, SQLITE = 0, 1
SIDES = (MEMORY, SQLITE)


@dataclass(eq=False)
class Node:
    ids: tuple[int, int]  # in the memory state, in the SQLite state
    kind: str
    deleted: bool = False

    @property
    def interval(self) -> float:
        return KINDS[self.kind]


@dataclass(eq=False)
class Sent:
    """One message, pushed to both states."""

    index: int
    pushed: tuple[Message, Message]  # as each state stamped it
    expires_at: float
    node_reply: str | None = None  # the variant of the reply its node got stored
    reply_ids: list[str | None] = field(default_factory=lambda: [None, None])
    acked: bool = False

    def message_id(self, side: int) -> str:
        return self.pushed[side].metadata.message_id

    def sender(self, side: int) -> int:
        return self.pushed[side].metadata.dst_node_id


def answer(to: Message, variant: str) -> Message:
    if variant == "error":
        failure = Error(int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION), "boom")
        return Message(error=failure, reply_to=to)
    return Message(RecordDict({"reply": ConfigRecord({"variant": variant})}), reply_to=to)


def variant_of(reply: Message) -> str:
    if reply.has_error():
        return "error"
    return str(reply.content.config_records["reply"]["variant"])


class LinkStates(RuleBasedStateMachine):
    """Both LinkStates, driven in step from this (synchronous) test thread via a portal."""

    directory: Path  # set by the test, before the machine runs
    _files = itertools.count()

    nodes = Bundle("nodes")
    deleted = Bundle("deleted")
    sent = Bundle("sent")

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal: BlockingPortal = self.stack.enter_context(start_blocking_portal("asyncio"))
        self.clock = FakeClock()
        self.path = self.directory / f"link-{next(self._files)}.db"
        self.node_of: list[dict[int, Node]] = [{}, {}]
        self.all_sent: list[Sent] = []
        self.heard: list[Counter[tuple[str, object]]] = [Counter(), Counter()]
        self.run_ids: tuple[int, int] | None = None
        self.quarters = 0
        memory = InMemoryLinkState(self.clock, seed=0, heartbeat_patience=PATIENCE)
        self.stack.enter_context(self.portal.wrap_async_context_manager(memory))
        self.states: list[LinkState] = [memory, self._open_sqlite()]
        runs = self.both(lambda state, _: state.create_run({}))
        memory_run, sqlite_run = (run for run in runs if not isinstance(run, FedcoreError))
        self.run_ids = (memory_run.run_id, sqlite_run.run_id)
        self._listen(MEMORY, self.stack)
        self._listen(SQLITE, self.sqlite_stack)

    def _open_sqlite(self, state: LinkState | None = None) -> LinkState:
        """Open the file (with a new state, or ``state`` again); listen first, to hear
        what fell due while it was closed."""
        self.sqlite_stack = ExitStack()
        if state is None:
            state = SqliteLinkState(self.path, self.clock, heartbeat_patience=PATIENCE)
        if self.run_ids is not None:
            self.states[SQLITE] = state
            self._listen(SQLITE, self.sqlite_stack)
        return self.sqlite_stack.enter_context(self.portal.wrap_async_context_manager(state))

    def _listen(self, side: int, stack: ExitStack) -> None:
        assert self.run_ids is not None
        state, heard = self.states[side], self.heard[side]

        def hear(topic: str) -> Callable[[object], None]:
            return lambda key: heard.update([(topic, key)])

        stack.enter_context(state.watch_nodes(hear("node")))
        stack.enter_context(state.watch_messages(hear("message")))
        stack.enter_context(state.watch_replies(self.run_ids[side], hear("reply")))

    def _run_id(self, side: int) -> int:
        assert self.run_ids is not None
        return self.run_ids[side]

    def teardown(self) -> None:
        with self.stack:  # the portal goes last
            self.sqlite_stack.close()

    def both(self, call: Callable[[LinkState, int], Awaitable[T]]) -> list[T | FedcoreError]:
        """``call`` on each state; both must succeed, or both refuse with the same error."""
        outcomes: list[T | FedcoreError] = []
        for side, state in enumerate(self.states):
            try:
                outcomes.append(self.portal.call(call, state, side))
            except FedcoreError as exc:
                outcomes.append(exc)
        kinds = [
            type(outcome) if isinstance(outcome, FedcoreError) else None for outcome in outcomes
        ]
        assert kinds[MEMORY] == kinds[SQLITE], f"memory: {outcomes[0]!r}, sqlite: {outcomes[1]!r}"
        return outcomes

    # Steps -------------------------------------------------------------------------

    @precondition(lambda self: sum(not node.deleted for node in self.node_of[MEMORY].values()) < 3)
    @rule(target=nodes, kind=st.sampled_from(list(KINDS)))
    def create_node(self, kind: str) -> Node:
        interval = KINDS[kind]
        memory, sqlite = self.both(lambda s, _: s.create_node(heartbeat_interval=interval))
        assert isinstance(memory, int)
        assert isinstance(sqlite, int)
        node = Node((memory, sqlite), kind)
        self.node_of[MEMORY][memory] = self.node_of[SQLITE][sqlite] = node
        return node

    @rule(node=nodes)
    def heartbeat(self, node: Node) -> None:
        self.both(lambda s, side: s.heartbeat(node.ids[side], heartbeat_interval=node.interval))

    @rule(target=deleted, node=consumes(nodes))
    def delete_node(self, node: Node) -> Node:
        self.both(lambda state, side: state.delete_node(node.ids[side]))
        node.deleted = True
        return node

    @rule(node=deleted)
    def a_deleted_node_stays_deleted(self, node: Node) -> None:
        calls: list[Callable[[LinkState, int], Awaitable[object]]] = [
            lambda state, side: state.heartbeat(node.ids[side], heartbeat_interval=node.interval),
            lambda state, side: state.pull_messages(node.ids[side]),
            lambda state, side: state.delete_node(node.ids[side]),
        ]
        for call in calls:
            outcomes = self.both(call)
            assert all(isinstance(outcome, NodeNotFoundError) for outcome in outcomes)

    @rule(target=sent, node=nodes, ttl=st.sampled_from(TTLS), to_unknown=st.booleans())
    def push(self, node: Node, ttl: float, to_unknown: bool) -> Sent:
        node_ids = (UNKNOWN_NODE, UNKNOWN_NODE) if to_unknown else node.ids
        records = RecordDict({"c": ConfigRecord({"n": len(self.all_sent)})})
        pushed = (
            Message(records, node_ids[MEMORY], "train", ttl=ttl),
            Message(records, node_ids[SQLITE], "train", ttl=ttl),
        )
        self.both(lambda state, side: state.push_messages(self._run_id(side), [pushed[side]]))
        item = Sent(len(self.all_sent), pushed, self.clock.now() + ttl)
        self.all_sent.append(item)
        return item

    @rule(node=nodes, lease=st.sampled_from(LEASES), limit=st.sampled_from([None, 1]))
    def pull(self, node: Node, lease: float | None, limit: int | None) -> None:
        self._pull(node, lease, limit)

    def _pull(self, node: Node, lease: float | None, limit: int | None) -> list[Sent]:
        outcomes = self.both(
            lambda state, side: state.pull_messages(node.ids[side], limit=limit, lease=lease)
        )
        handed: list[list[Sent]] = []
        for side, pulled in enumerate(outcomes):
            if isinstance(pulled, FedcoreError):
                return []
            by_id = {item.message_id(side): item for item in self.all_sent}
            items = [by_id[message.metadata.message_id] for message in pulled]
            for item, message in zip(items, pulled, strict=True):
                assert message.content == item.pushed[side].content
                assert message.metadata == item.pushed[side].metadata
            handed.append(items)
        assert handed[MEMORY] == handed[SQLITE], "the states handed out different messages"
        return handed[MEMORY]

    @rule(node=nodes, lease=st.sampled_from(LEASES[:-1]), ttl=st.sampled_from(TTLS))
    def a_node_dies_after_pulling(self, node: Node, lease: float, ttl: float) -> None:
        """Its lease runs out: each message is handed out again, or has fedcore's error."""
        self.push(node, ttl, to_unknown=False)
        leased = self._pull(node, lease, None)
        self.advance(1.0 if lease < 1.0 else 2.0)  # it restarts, so steady ones heartbeat
        again = self._pull(node, lease, None)
        answered = self._replies(MEMORY)
        for item in leased:
            redelivered = item in again
            assert redelivered != (item.message_id(MEMORY) in answered), (item.index, redelivered)

    @rule(node=nodes, lease=st.sampled_from(LEASES[:-1]))
    def renew_leases(self, node: Node, lease: float) -> None:
        """A node still working renews its leases, naming every message sent so far: both
        states refuse the same ones (not leased to it now), in the order named."""
        outcomes = self.both(
            lambda state, side: state.renew_leases(
                node.ids[side], [item.message_id(side) for item in self.all_sent], lease=lease
            )
        )
        refused = []
        for side, outcome in enumerate(outcomes):
            if isinstance(outcome, FedcoreError):
                return
            index = {item.message_id(side): item.index for item in self.all_sent}
            refused.append([index[message_id] for message_id in outcome])
        assert refused[MEMORY] == refused[SQLITE], "the states renewed different leases"

    @rule(
        node=nodes,
        lease=st.sampled_from(LEASES),
        variant=st.sampled_from(VARIANTS),
        retry=st.booleans(),
    )
    def serve(self, node: Node, lease: float | None, variant: str, retry: bool) -> None:
        """What a node does: pull, answer each message; if the response got lost, again."""
        for item in self._pull(node, lease, None):
            for _ in range(1 + retry):
                self.push_reply(item, variant)

    @rule(item=sent, variant=st.sampled_from(VARIANTS))
    def push_reply(self, item: Sent, variant: str) -> None:
        outcomes = self.both(
            lambda state, side: state.push_reply(
                item.sender(side), answer(item.pushed[side], variant)
            )
        )
        if item.acked:
            assert all(isinstance(outcome, MessageNotFoundError) for outcome in outcomes)
        elif item.node_reply == variant:
            assert outcomes == item.reply_ids, "an identical retry was not idempotent"
        elif item.node_reply is not None:
            assert all(isinstance(outcome, ConflictError) for outcome in outcomes)
        elif not isinstance(outcomes[MEMORY], FedcoreError):
            assert item.reply_ids == [None, None], "a message got a second reply"
            item.node_reply = variant
            item.reply_ids = [str(outcome) for outcome in outcomes]
        else:
            assert isinstance(outcomes[MEMORY], ReplyRejectedError), outcomes

    @rule(items=st.lists(sent, min_size=1, max_size=3))
    def ack(self, items: list[Sent]) -> None:
        outcomes = self.both(
            lambda state, side: state.ack_replies(
                self._run_id(side), [item.message_id(side) for item in items]
            )
        )
        if isinstance(outcomes[MEMORY], InvalidTransitionError):
            return  # some message had no reply yet; the invariants check nothing went
        for item in items:
            item.acked = True

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        """Move the clock a quarter second at a time; steady nodes beat every second.

        After each move both states are called and compared, which fires the timers
        that fell due then, as a prompt reaper would. Two reasons. A fired timer stamps
        its error reply with the time it fired, and the SQLite state's reaper, working
        in a thread, may not have fired it yet when the clock moves on. And when one
        sweep finds a node silent and a message of its expired, the in-memory state may
        take the node's silence for the earlier event even when its heartbeats had put
        it later (test_sqlite_state.py has the case); firing at every quarter second,
        where all heartbeat deadlines fall, keeps such sweeps from happening here.
        """
        for _ in range(round(seconds / QUARTER)):
            self.portal.call(self.clock.advance, QUARTER)
            self.both_see_the_same_nodes_and_announce_the_same_changes()
            self.quarters += 1
            if self.quarters % 4 == 0:
                for node in self.node_of[MEMORY].values():
                    if node.kind == "steady" and not node.deleted:
                        self.heartbeat(node)

    @precondition(lambda self: self.all_sent)
    @rule(same_object=st.booleans())
    def restart_sqlite(self, same_object: bool) -> None:
        """Close the file and open it again, at the same time: the clock does not move
        while the SQLite state is closed, as the in-memory state cannot be closed.
        (Test_sqlite_state.py checks what happens to timers that pass meanwhile.)"""
        (online, _) = self.both(lambda state, _: state.get_node_ids())  # fires what is due
        assert isinstance(online, list)
        self.sqlite_stack.close()
        self.states[SQLITE] = self._open_sqlite(self.states[SQLITE] if same_object else None)
        memory = self.states[MEMORY]
        for node_id in online:
            interval = self.node_of[MEMORY][node_id].interval
            self.portal.call(partial(memory.heartbeat, node_id, heartbeat_interval=interval))

    # Invariants --------------------------------------------------------------------

    @invariant()
    def both_see_the_same_nodes_and_announce_the_same_changes(self) -> None:
        """Notifications are compared after a call to each state, which fires what is due:
        until then, a timer's news may still be on its way from the SQLite state's reaper."""
        online = self.both(lambda state, _: state.get_node_ids())
        handles, announced = [], []
        for side, node_ids in enumerate(online):
            assert isinstance(node_ids, list)
            node_of = self.node_of[side]
            handles.append([node_of[node_id] for node_id in node_ids])
            announced.append(
                Counter(
                    {
                        (topic, node_of[key].ids[MEMORY] if key in node_of else key): count
                        for (topic, key), count in self.heard[side].items()
                        if topic != "reply"
                    }
                )
            )
        assert handles[MEMORY] == handles[SQLITE]
        assert announced[MEMORY] == announced[SQLITE]

    @invariant()
    def replies_keep_their_promises(self) -> None:
        now = self.clock.now()
        seen = [self._replies(side) for side in SIDES]
        for item in self.all_sent:
            for side in SIDES:
                reply = seen[side].get(item.message_id(side))
                announced = self.heard[side][("reply", item.message_id(side))]
                if item.acked:
                    assert reply is not None, "an acknowledged message got no answer"
                    assert reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE
                    assert reply.metadata.message_id == "", "an acknowledged reply is still served"
                    assert announced == 1, f"message {item.index}'s reply announced {announced}x"
                    continue
                if reply is None:
                    assert now < item.expires_at, f"message {item.index} expired without a reply"
                    assert item.node_reply is None, f"the reply to message {item.index} was lost"
                    assert announced == 0, f"message {item.index}: a reply announced, none served"
                    continue
                assert announced == 1, f"message {item.index}'s reply announced {announced}x"
                if item.reply_ids[side] is None:
                    item.reply_ids[side] = reply.metadata.message_id
                assert reply.metadata.message_id == item.reply_ids[side], "a reply changed"
                if item.node_reply is not None:
                    assert variant_of(reply) == item.node_reply
        assert self._normalised(seen[MEMORY], MEMORY) == self._normalised(seen[SQLITE], SQLITE)
        for side in SIDES:
            # Pulling without ids ("pull any") serves exactly the replies held, once each.
            every = self.portal.call(self.states[side].get_replies, self._run_id(side), None)
            held = [reply.metadata.reply_to_message_id for reply in every]
            assert len(held) == len(set(held)), "pull any served a reply twice"
            assert set(held) == {i for i, r in seen[side].items() if r.metadata.message_id}

    def _replies(self, side: int) -> dict[str, Message]:
        ids = [item.message_id(side) for item in self.all_sent]
        replies = self.portal.call(self.states[side].get_replies, self._run_id(side), ids)
        return {reply.metadata.reply_to_message_id: reply for reply in replies}

    def _normalised(self, replies: dict[str, Message], side: int) -> list[tuple[Any, ...]]:
        """What a ServerApp sees of the replies, with each state's ids replaced."""
        rows = []
        for item in self.all_sent:
            reply = replies.get(item.message_id(side))
            if reply is None:
                rows.append((item.index, None))
                continue
            meta = reply.metadata
            node = self.node_of[side].get(meta.src_node_id)
            sender = meta.src_node_id if node is None else node.ids[MEMORY]
            outcome = reply.error.code if reply.has_error() else variant_of(reply)
            stamps = (meta.created_at, meta.ttl, meta.group_id, meta.message_type, meta.dst_node_id)
            rows.append((item.index, outcome, sender, stamps))
        return rows


@pytest.mark.slow  # random interleavings of both states: 15 s; the conformance suite stays in CI
def test_both_linkstates_keep_their_promises_under_random_interleavings(tmp_path: Path) -> None:
    LinkStates.directory = tmp_path
    run_state_machine_as_test(
        LinkStates,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
