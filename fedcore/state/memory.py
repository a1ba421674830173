"""The in-memory LinkState: simulation's state, and the reference for the others.

It keeps facts in dicts and schedules timers; what happens to them is
:mod:`fedcore.state.ledger`'s. Everything runs on the event loop thread without an
await in between, so each method is atomic by construction. Time-driven events (a TTL
passing, a lease running out, a node or a ServerApp missing its heartbeats, a claim
running out) are timers on one heap, fired by a reaper task (started by ``async with``)
and also at the top of every call, so a state used without its reaper never serves
stale facts; a :class:`~fedcore.state.stalls.StallWatch` re-arms the liveness deadlines
that passed while the loop was stalled. Runs, claims, bundles, contexts and logs are
:mod:`fedcore.state.memory_runs`. Ids come from a seeded ``random.Random``: the same
seed gives the same node ids, and so the same sampled cohorts, run after run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock, SystemClock
from fedcore.domain import (
    LogLine,
    Message,
    MessageStatus,
    MetricsLine,
    RecordDict,
    Run,
    RunStatus,
)
from fedcore.errors import NodeNotFoundError
from fedcore.state import ledger
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE, LinkState, RunClaim
from fedcore.state.ledger import (
    Answer,
    check_heartbeat_interval,
    check_lease,
    check_retirement,
    new_id,
)
from fedcore.state.memory_runs import MemoryRuns
from fedcore.state.notify import Subscription, Topic
from fedcore.state.stalls import StallWatch


@dataclass(slots=True)
class _Node:
    online_until: float
    heartbeat_interval: float
    online: bool = True  # false once the reaper has declared it offline
    public_key: bytes | None = None


@dataclass(slots=True)
class _Entry:
    message: Message
    status: MessageStatus = MessageStatus.PENDING
    lease: int = 0
    lease_until: float = math.inf
    reply: Message | None = None
    generated: bool = False
    stored: int = 0  # when the reply came, among the state's replies: their order


class InMemoryLinkState(LinkState):
    """A :class:`~fedcore.state.base.LinkState` in dictionaries."""

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        seed: int | None = None,
        heartbeat_patience: float = DEFAULT_HEARTBEAT_PATIENCE,
        stalls: StallWatch | None = None,
    ) -> None:
        self._clock = clock or SystemClock()
        self._stalls = stalls
        self._ids = random.Random(seed)
        self._patience = heartbeat_patience
        self._nodes: dict[int, _Node] = {}
        self._keys: dict[bytes, int] = {}
        self._messages: dict[str, _Entry] = {}
        self._open: dict[int, dict[str, None]] = {}
        self._run_messages: dict[int, set[str]] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._replies_stored = itertools.count()
        self._runs = MemoryRuns(
            self._clock,
            self._ids,
            heartbeat_patience,
            schedule=self._schedule,
            drop_messages=self._drop_run_messages,
        )
        self._wakeup: anyio.Event | None = None
        self._task_group: TaskGroup | None = None
        self._message_topic: Topic[int, int] = Topic()
        self._reply_topic: Topic[int, str] = Topic()
        self._node_topic: Topic[int, int] = Topic()

    async def __aenter__(self) -> Self:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._reap, name="linkstate-reaper")
        if self._stalls is not None:
            self._stalls.on_stall(self._rearm)
            self._task_group.start_soon(self._stalls.run, name="linkstate-stall-watch")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        # The body's exception is not the reaper's: let it propagate as it is, rather
        # than wrapped in an ExceptionGroup by the reaper's task group.
        await self._task_group.__aexit__(None, None, None)
        self._task_group = None

    # Timers ----------------------------------------------------------------------

    def _schedule(self, deadline: float, fire: Callable[[], None]) -> None:
        """Call ``fire`` once the clock reaches ``deadline``."""
        if math.isinf(deadline):
            return
        heapq.heappush(self._timers, (deadline, next(self._sequence), fire))
        if self._timers[0][0] == deadline and self._wakeup is not None:
            self._wakeup.set()

    def _fire_due(self) -> None:
        now = self._clock.now()
        stall = None if self._stalls is None else self._stalls.catch_up(now)
        if stall is not None:
            self._rearm(*stall)
        while self._timers and self._timers[0][0] <= now:
            _, _, fire = heapq.heappop(self._timers)
            fire()

    def _rearm(self, since: float, now: float) -> None:
        """The loop stalled from ``since`` to ``now``: what lapsed meanwhile gets more time.

        Heartbeat deadlines get a full patience from now, as after a restart; leases
        and claims the time the stall took.
        """
        for node_id, node in self._nodes.items():
            if node.online and since < node.online_until <= now:
                node.online_until = ledger.silent_at(now, self._patience, node.heartbeat_interval)
                self._schedule(
                    node.online_until, partial(self._check_node, node_id, node.online_until)
                )
        for entry in self._messages.values():
            if entry.status is MessageStatus.LEASED and since < entry.lease_until <= now:
                entry.lease += 1
                self._lease_until(entry, entry.lease_until + (now - since))
        self._runs.rearm(since, now)

    async def _reap(self) -> None:
        while True:
            self._fire_due()
            delay = self._timers[0][0] - self._clock.now() if self._timers else None
            self._wakeup = anyio.Event()
            with self._clock.move_on_after(delay):
                await self._wakeup.wait()

    def _expire_message(self, message_id: str) -> None:
        entry = self._messages.get(message_id)
        if entry is None or not ledger.is_open(entry.status):
            return
        self._answer(entry, ledger.expired(entry.message.metadata.ttl))

    def _end_lease(self, message_id: str, lease: int) -> None:
        entry = self._messages.get(message_id)
        if entry is None or entry.status is not MessageStatus.LEASED or entry.lease != lease:
            return
        entry.status = ledger.lease_ends(entry.status)
        node_id = entry.message.metadata.dst_node_id
        self._message_topic.publish(node_id, node_id)

    def _check_node(self, node_id: int, deadline: float) -> None:
        # A node has one timer per heartbeat. A timer whose deadline a later heartbeat
        # moved is stale and does nothing; the node went silent at its current
        # deadline, which is when its own timer fires (after earlier expiries).
        node = self._nodes.get(node_id)
        if node is None or not node.online or node.online_until > deadline:
            return
        node.online = False
        self._fail_open_messages(node_id, ledger.NODE_SILENT)
        self._node_topic.publish(node_id, node_id)

    # Nodes -------------------------------------------------------------------------

    def _online(self, node_id: int) -> bool:
        node = self._nodes.get(node_id)
        return node is not None and node.online_until > self._clock.now()

    async def create_nodes(self, count: int, *, heartbeat_interval: float) -> list[int]:
        if count < 0:
            raise ValueError(f"cannot create {count} nodes")
        check_heartbeat_interval(heartbeat_interval)
        self._fire_due()
        online_until = ledger.silent_at(self._clock.now(), self._patience, heartbeat_interval)
        created = []
        for _ in range(count):
            node_id = new_id(self._ids, self._nodes.__contains__)
            self._nodes[node_id] = _Node(online_until, heartbeat_interval)
            self._schedule(online_until, partial(self._check_node, node_id, online_until))
            created.append(node_id)
            self._node_topic.publish(node_id, node_id)
        return created

    async def register_node(self, public_key: bytes, *, heartbeat_interval: float) -> int:
        node_id = self._keys.get(public_key)
        if node_id is not None:
            await self.heartbeat(node_id, heartbeat_interval=heartbeat_interval)
            return node_id
        (node_id,) = await self.create_nodes(1, heartbeat_interval=heartbeat_interval)
        self._nodes[node_id].public_key = public_key
        self._keys[public_key] = node_id
        return node_id

    async def node_with_key(self, public_key: bytes) -> int:
        node_id = self._keys.get(public_key)
        if node_id is None:
            raise NodeNotFoundError("no node has registered with this key")
        return node_id

    async def delete_node(self, node_id: int) -> None:
        self._fire_due()
        node = self._nodes.pop(node_id, None)
        if node is None:
            raise NodeNotFoundError(f"no node {node_id}")
        if node.public_key is not None:
            del self._keys[node.public_key]
        self._fail_open_messages(node_id, ledger.NODE_DELETED)
        self._open.pop(node_id, None)
        self._node_topic.publish(node_id, node_id)

    async def retire_nodes(self, *, offline_for: float) -> list[int]:
        check_retirement(offline_for)
        self._fire_due()
        before = self._clock.now() - offline_for
        retired = [
            node_id
            for node_id, node in self._nodes.items()
            if node.public_key is not None and not node.online and node.online_until <= before
        ]
        for node_id in retired:
            await self.delete_node(node_id)
        return retired

    async def heartbeat(self, node_id: int, *, heartbeat_interval: float) -> None:
        check_heartbeat_interval(heartbeat_interval)
        self._fire_due()
        node = self._nodes.get(node_id)
        if node is None:
            raise NodeNotFoundError(f"no node {node_id}")
        # _fire_due() has just declared the node offline if its deadline passed.
        was_online, node.online = node.online, True
        node.heartbeat_interval = heartbeat_interval
        node.online_until = ledger.silent_at(self._clock.now(), self._patience, heartbeat_interval)
        self._schedule(node.online_until, partial(self._check_node, node_id, node.online_until))
        if not was_online:
            self._node_topic.publish(node_id, node_id)

    async def get_node_ids(self) -> list[int]:
        self._fire_due()
        now = self._clock.now()
        return [node_id for node_id, node in self._nodes.items() if node.online_until > now]

    # Runs, claims, bundles, contexts and logs: see fedcore.state.memory_runs --------

    async def create_run(
        self, run_config: dict[str, Any], *, seed: int | None = None, bundle_hash: str = ""
    ) -> Run:
        self._fire_due()
        return self._runs.create_run(run_config, seed, bundle_hash)

    async def list_runs(self) -> list[Run]:
        self._fire_due()
        return self._runs.list_runs()

    async def get_run(self, run_id: int) -> Run:
        self._fire_due()
        return self._runs.get_run(run_id)

    async def update_run_status(
        self, run_id: int, status: RunStatus, reason: str = "", *, token: int | None = None
    ) -> Run:
        self._fire_due()
        return self._runs.update_run_status(run_id, status, reason, token)

    def _drop_run_messages(self, run_id: int) -> None:
        """A run finished: its messages and their replies go."""
        for message_id in self._run_messages.pop(run_id, ()):
            entry = self._messages.pop(message_id)
            self._open.get(entry.message.metadata.dst_node_id, {}).pop(message_id, None)

    def watch_runs(self, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_runs(callback)

    async def claim_runs(self, *, limit: int, lease: float) -> list[RunClaim]:
        self._fire_due()
        return self._runs.claim_runs(limit, lease)

    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        self._fire_due()
        return self._runs.renew_claim(run_id, token, lease)

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        self._fire_due()
        return self._runs.start_run(run_id, token, heartbeat_interval)

    async def heartbeat_run(self, run_id: int, *, heartbeat_interval: float) -> Run:
        self._fire_due()
        return self._runs.heartbeat_run(run_id, heartbeat_interval)

    async def check_run_secret(self, run_id: int, secret: str) -> Run:
        self._fire_due()
        return self._runs.check_run_secret(run_id, secret)

    async def put_bundle(self, data: bytes) -> str:
        return self._runs.put_bundle(data)

    async def get_bundle(self, bundle_hash: str) -> bytes:
        return self._runs.get_bundle(bundle_hash)

    async def save_context(self, run_id: int, node_id: int, state: RecordDict) -> None:
        self._runs.save_context(run_id, node_id, state)

    async def load_context(self, run_id: int, node_id: int) -> RecordDict:
        return self._runs.load_context(run_id, node_id)

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> int:
        return self._runs.append_logs(run_id, lines, batch)

    async def get_logs(self, run_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        return self._runs.get_logs(run_id, after, limit)

    def watch_logs(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_logs(run_id, callback)

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> int:
        return self._runs.append_metrics(run_id, documents, batch)

    async def get_metrics(
        self, run_id: int, *, after: int = 0, limit: int = 1000
    ) -> list[MetricsLine]:
        return self._runs.get_metrics(run_id, after, limit)

    def watch_metrics(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_metrics(run_id, callback)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        self._runs.put_artifact(run_id, name, content)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        return self._runs.get_artifact(run_id, name)

    # The ServerApp's side ------------------------------------------------------------

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        self._fire_due()
        ledger.check_takes_messages(run_id, self._runs.status(run_id))
        run_messages = self._run_messages.setdefault(run_id, set())
        for message in messages:
            chosen = message.metadata.message_id
            if chosen:
                entry = self._messages.get(chosen)
                owner = None if entry is None else entry.message.metadata.run_id
                ledger.check_chosen_id(run_id, chosen, owner)
        now = self._clock.now()
        ids = []
        for message in messages:
            meta = message.metadata
            if meta.message_id in run_messages:  # a retry: stored already
                ids.append(meta.message_id)
                continue
            ledger.stamp_message(meta, run_id, now, meta.message_id or self._new_message_id())
            entry = _Entry(message)
            self._messages[meta.message_id] = entry
            run_messages.add(meta.message_id)
            ids.append(meta.message_id)
            answer = ledger.on_arrival(meta.dst_node_id, self._online(meta.dst_node_id))
            if answer is not None:
                self._answer(entry, answer)
                continue
            self._open.setdefault(meta.dst_node_id, {})[meta.message_id] = None
            self._schedule(meta.expires_at, partial(self._expire_message, meta.message_id))
            self._message_topic.publish(meta.dst_node_id, meta.dst_node_id)
        return ids

    def _new_message_id(self) -> str:
        return ledger.new_message_id(self._ids, self._messages.__contains__)

    async def get_replies(self, run_id: int, message_ids: Iterable[str] | None) -> list[Message]:
        self._fire_due()
        self._runs.status(run_id)
        if message_ids is None:
            entries = (self._messages[i] for i in self._run_messages.get(run_id, ()))
            replied = sorted((e for e in entries if e.reply is not None), key=lambda e: e.stored)
            return [entry.reply for entry in replied if entry.reply is not None]
        replies = []
        for message_id in message_ids:
            entry = self._messages.get(message_id)
            if entry is None or entry.message.metadata.run_id != run_id:
                replies.append(ledger.unknown_message_reply(run_id, message_id))
            elif entry.reply is not None:
                replies.append(entry.reply)
        return replies

    async def ack_replies(self, run_id: int, message_ids: Iterable[str]) -> None:
        self._fire_due()
        self._runs.status(run_id)
        known: dict[str, _Entry] = {}
        for message_id in message_ids:
            entry = self._messages.get(message_id)
            if entry is None or entry.message.metadata.run_id != run_id:
                continue
            # Check them all before deleting any: a refused ack changes nothing.
            ledger.acknowledged(entry.status)
            known[message_id] = entry
        for message_id in known:
            del self._messages[message_id]
            self._run_messages[run_id].discard(message_id)

    # The node's side -----------------------------------------------------------------

    async def renew_leases(
        self, node_id: int, message_ids: Sequence[str], *, lease: float
    ) -> list[str]:
        check_lease(lease)
        self._fire_due()
        if node_id not in self._nodes:
            raise NodeNotFoundError(f"no node {node_id}")
        released = []
        for message_id in message_ids:
            entry = self._messages.get(message_id)
            if (
                entry is None
                or entry.status is not MessageStatus.LEASED
                or entry.message.metadata.dst_node_id != node_id
            ):
                released.append(message_id)
                continue
            entry.lease += 1
            self._lease_until(entry, self._clock.now() + lease)
        return released

    def _lease_until(self, entry: _Entry, deadline: float) -> None:
        """Start the entry's current lease (``entry.lease``), to run out at ``deadline``."""
        entry.lease_until = deadline
        lease = partial(self._end_lease, entry.message.metadata.message_id, entry.lease)
        self._schedule(deadline, lease)

    async def pull_messages(
        self, node_id: int, *, limit: int | None = None, lease: float | None = None
    ) -> list[Message]:
        self._fire_due()
        if node_id not in self._nodes:
            raise NodeNotFoundError(f"no node {node_id}")
        pulled: list[Message] = []
        for message_id in self._open.get(node_id, ()):
            if limit is not None and len(pulled) >= limit:
                break
            entry = self._messages[message_id]
            if entry.status is not MessageStatus.PENDING:
                continue
            entry.status = ledger.lease(entry.status)
            entry.lease += 1
            if lease is None:
                entry.lease_until = math.inf
            else:
                self._lease_until(entry, self._clock.now() + lease)
            pulled.append(entry.message)
        return pulled

    async def push_reply(self, node_id: int, reply: Message) -> str:
        self._fire_due()
        entry = self._messages.get(reply.metadata.reply_to_message_id)
        original = ledger.check_reply(
            node_id, None if entry is None else entry.message.metadata, reply
        )
        assert entry is not None
        if entry.reply is not None:
            stored = entry.reply
            same = stored.has_error() == reply.has_error() and (
                stored.error == reply.error
                if stored.has_error()
                else stored.content == reply.content
            )
            answered = stored.error.reason if entry.generated else None
            return ledger.repeated_reply(
                original.message_id, stored.metadata.message_id, answered, same
            )
        status = ledger.replied(entry.status)
        ledger.stamp_reply(reply.metadata, original, self._clock.now(), self._new_message_id())
        self._store_reply(entry, status, reply, generated=False)
        return reply.metadata.message_id

    def _store_reply(
        self, entry: _Entry, status: MessageStatus, reply: Message, *, generated: bool
    ) -> None:
        entry.status = status
        entry.reply, entry.generated = reply, generated
        entry.stored = next(self._replies_stored)
        meta = entry.message.metadata
        self._open.get(meta.dst_node_id, {}).pop(meta.message_id, None)
        self._reply_topic.publish(meta.run_id, meta.message_id)

    def _answer(self, entry: _Entry, answer: Answer) -> None:
        status = ledger.replied(entry.status)
        meta = entry.message.metadata
        reply = ledger.answer_reply(meta, answer, self._clock.now(), self._new_message_id())
        self._store_reply(entry, status, reply, generated=True)

    def _fail_open_messages(self, node_id: int, why: str) -> None:
        for message_id in list(self._open.get(node_id, ())):
            self._answer(self._messages[message_id], ledger.node_gone(node_id, why))

    # Notifications ---------------------------------------------------------------

    def watch_messages(
        self, callback: Callable[[int], None], node_id: int | None = None
    ) -> Subscription:
        return self._message_topic.subscribe(callback, node_id)

    def watch_replies(self, run_id: int, callback: Callable[[str], None]) -> Subscription:
        return self._reply_topic.subscribe(callback, run_id)

    def watch_nodes(self, callback: Callable[[int], None]) -> Subscription:
        return self._node_topic.subscribe(callback)
