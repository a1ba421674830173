"""The SQLite LinkState: the link's state in one file, kept across restarts and crashes.

It keeps every promise of :mod:`fedcore.state.base` (the conformance suite checks both
implementations alike); what follows is how, and what a file adds.

**One connection, off the event loop.** sqlite3 calls block, so all database work runs
in anyio's worker threads. One connection serves every call, and an ``anyio.Lock``
lets one transaction at a time use it, in the order the callers came. The lock is held
around "run the transaction in a thread, then publish its notifications", so
notifications come out in commit order and the next transaction sees an up-to-date
deadline cache (below) — which a ``CapacityLimiter(1)`` on the thread call alone would
not guarantee, and a dedicated thread would only add a queue to. The connection moves
between pool threads (``check_same_thread=False``), which SQLite allows as long as two
calls never overlap; the lock sees to that. The clock is read on the loop, under the
lock, and handed to the thread: an injected clock may belong to the loop.

**One transaction per call.** Each method is one ``BEGIN IMMEDIATE … COMMIT``: atomic,
as the memory state's methods are by running without an await, and holding the write
lock from the start, so a transaction never fails half-way on a lock. A call that
refuses (``NodeNotFoundError``, a ``ValueError``…) rolls back to a savepoint: its own
changes vanish, but the timers that fell due before it stay fired, as in memory.
SQLite errors are raised as :class:`~fedcore.errors.StateError`.

**Durable.** WAL with ``synchronous=FULL``: a commit returns once the log is on disk,
so a reply whose push returned survives ``kill -9`` and power loss (DESIGN.md R2).
Heartbeats alone commit with ``synchronous=NORMAL`` — atomic and consistent, just not
synced before returning: losing the last ones in a crash costs nothing (see restarts),
while a thousand nodes beating once a second would otherwise be a thousand syncs a
second. Any later durable commit syncs them anyway, since the log is written in order.

**Timers are columns.** A message's expiry, a lease's end and a node's heartbeat
deadline are stored times. Before each call's own work, the state fires every timer
that fell due, earliest first (at equal times: expiries, then silent nodes, then
leases): error replies for expired messages (code 3) and for the open messages of
silent nodes (code 5), leases back to pending. The earliest stored deadline is cached,
so a call with nothing due runs no timer query; a reaper task sleeps on the injected
clock until that deadline and fires the timers even when nobody calls, so that
notifications come on time.

**Restarts.** Opening a file is a restart: the stored deadlines are the timers, and
they keep running on the clock (Unix time, so across processes and machines). Expiries
and leases that passed while the link was down fire at once on opening — a TTL is a
promise to the ServerApp, whose own timeouts ran on, and a lapsed lease only makes a
message deliverable again. Heartbeat deadlines are the exception: nodes cannot
heartbeat a link that is down, so every node online when it stopped gets a full
``patience × heartbeat_interval`` from the opening to show up again, and one that does
not is declared offline then, within the usual bound.

**One link per file.** Several processes may open a fresh file at once (migrations
take turns, see :mod:`fedcore.state.sql`), but the deadline cache and the notifications
(in-process, published on the event loop after the commit, as in the memory state)
assume that one state at a time writes the file.

**Bytes.** Metadata are columns; content is a RecordDict payload of
:mod:`fedcore.wire`, and so is a run's config (as a ConfigRecord, whose value types it
must have). Ids come from a ``random.Random`` that ``seed`` seeds, as in memory.
"""

from __future__ import annotations

import math
import os
import random
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock, SystemClock
from fedcore.domain import (
    SERVER_NODE_ID,
    ConfigRecord,
    Error,
    ErrorCode,
    Message,
    MessageStatus,
    Metadata,
    RecordDict,
    Run,
    RunStatus,
    transition,
)
from fedcore.domain.message import assemble_message
from fedcore.errors import (
    ConflictError,
    MessageNotFoundError,
    NodeNotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    RunNotFoundError,
    StateError,
)
from fedcore.state.base import (
    DEFAULT_HEARTBEAT_PATIENCE,
    LinkState,
    check_heartbeat_interval,
    unknown_message_reply,
)
from fedcore.state.notify import Subscription, Topic
from fedcore.state.sql import QUERIES, migrate
from fedcore.wire import pack_recorddict, unpack_recorddict

T = TypeVar("T")

BUSY_TIMEOUT = 30.0
"""Seconds a connection waits for another process's write lock before it gives up."""

_RUN_CONFIG = "run_config"
_INT64 = range(-(2**63), 2**63)
"""What an SQLite INTEGER holds. No node or run has an id outside it, so such an id is
unknown (the wire allows unsigned 64-bit ids)."""


class SqliteLinkState(LinkState):
    """A :class:`~fedcore.state.base.LinkState` in an SQLite file (or ``":memory:"``).

    Enter it (``async with``) to open the file: that applies the migrations, fires the
    timers that fell due while it was closed and starts the reaper; leaving closes it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock | None = None,
        *,
        seed: int | None = None,
        heartbeat_patience: float = DEFAULT_HEARTBEAT_PATIENCE,
    ) -> None:
        if not 0 < heartbeat_patience < math.inf:
            raise ValueError(f"heartbeat_patience must be positive, got {heartbeat_patience}")
        self._path = os.fspath(path)
        self._clock = clock or SystemClock()
        self._ids = random.Random(seed)
        self._patience = heartbeat_patience
        self._connection: sqlite3.Connection | None = None
        self._lock: anyio.Lock | None = None
        self._task_group: TaskGroup | None = None
        # Every stored deadline is at or after _next_deadline (it is a lower bound).
        self._next_deadline = -math.inf
        self._wakeup: anyio.Event | None = None
        self._sleeping_until = math.inf
        self._events: list[Callable[[], None]] = []
        self._message_topic: Topic[int, int] = Topic()
        self._reply_topic: Topic[int, str] = Topic()
        self._node_topic: Topic[int, int] = Topic()

    async def __aenter__(self) -> Self:
        if self._connection is not None:
            raise RuntimeError(f"the SqliteLinkState on {self._path!r} is already open")
        self._lock = anyio.Lock()
        self._next_deadline, self._wakeup, self._sleeping_until = -math.inf, None, math.inf
        with self._translated_errors():
            self._connection = await anyio.to_thread.run_sync(self._open, self._clock.now())
        try:
            await self._transact(_nothing)  # fires what fell due while the file was closed
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._task_group.start_soon(self._reap, name="sqlite-linkstate-reaper")
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        # The body's exception is not the reaper's: let it propagate as it is.
        await self._task_group.__aexit__(None, None, None)
        self._task_group = None
        await self._close()

    def _open(self, now: float) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            connection.row_factory = sqlite3.Row
            (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode not in ("wal", "memory"):
                raise StateError(f"{self._path!r} cannot use a write-ahead log (mode {mode!r})")
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute("PRAGMA foreign_keys = ON")
            migrate(connection)
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                QUERIES["extend_online_nodes"], {"now": now, "patience": self._patience}
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.close()
            raise
        return connection

    async def _close(self) -> None:
        if self._lock is None:
            return
        with anyio.CancelScope(shield=True), self._translated_errors():
            async with self._lock:  # after the transaction under way, if any
                connection, self._connection = self._connection, None
                if connection is not None:
                    await anyio.to_thread.run_sync(connection.close)

    # Transactions ----------------------------------------------------------------

    @contextmanager
    def _translated_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StateError(f"the SQLite database {self._path!r} failed: {exc}") from exc

    async def _transact(self, work: Callable[[float], T], *, durable: bool = True) -> T:
        """Run ``work(now)`` in one transaction in a worker thread, then notify."""
        if self._lock is None:
            raise RuntimeError("open the SqliteLinkState with `async with` before using it")
        async with self._lock:
            if self._connection is None:
                raise RuntimeError(f"the SqliteLinkState on {self._path!r} is closed")
            now = self._clock.now()  # on the loop: the clock may belong to it (FakeClock)
            try:
                with self._translated_errors():
                    return await anyio.to_thread.run_sync(self._transaction, work, now, durable)
            finally:
                self._publish()

    def _transaction(self, work: Callable[[float], T], now: float, durable: bool) -> T:
        """In a worker thread: fire the timers due by ``now``, then ``work``; commit both.

        A refusal raised by ``work`` undoes only ``work``: it is raised after the
        commit. Anything else, and any SQLite error, rolls everything back.
        """
        db = self._db
        cached_deadline = self._next_deadline
        if not durable:
            if now >= cached_deadline:
                self._transaction(_nothing, now, durable=True)  # fired timers kept durably
            db.execute("PRAGMA synchronous = NORMAL")
        refusal: Exception | None = None
        try:
            db.execute("BEGIN IMMEDIATE")
            if now >= self._next_deadline:
                self._fire_timers(now)
            fired = len(self._events)
            db.execute("SAVEPOINT work")
            try:
                result = work(now)
            except sqlite3.Error:
                raise
            except Exception as exc:
                db.execute("ROLLBACK TO work")
                del self._events[fired:]
                refusal = exc
            db.execute("RELEASE work")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._events.clear()
            self._next_deadline = min(self._next_deadline, cached_deadline)
            raise
        finally:
            if not durable:
                db.execute("PRAGMA synchronous = FULL")
        if refusal is not None:
            raise refusal
        return result

    def _publish(self) -> None:
        """On the event loop, after a transaction: notify, and wake the reaper if needed."""
        events, self._events = self._events, []
        for publish in events:
            publish()
        if self._wakeup is not None and self._next_deadline < self._sleeping_until:
            self._wakeup.set()

    @property
    def _db(self) -> sqlite3.Connection:
        assert self._connection is not None
        return self._connection

    def _execute(self, query: str, **params: Any) -> int:
        return self._db.execute(QUERIES[query], params).rowcount

    def _row(self, query: str, **params: Any) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._db.execute(QUERIES[query], params).fetchone()
        return row

    def _rows(self, query: str, **params: Any) -> list[sqlite3.Row]:
        return self._db.execute(QUERIES[query], params).fetchall()

    # Timers ------------------------------------------------------------------------

    def _watch(self, deadline: float) -> None:
        self._next_deadline = min(self._next_deadline, deadline)

    def _fire_timers(self, now: float) -> None:
        """Fire every stored timer due by ``now``, earliest first; cache the next one."""
        while True:
            row = self._row("next_deadline")
            due = None if row is None else row[0]
            if due is None or due > now:
                self._next_deadline = math.inf if due is None else due
                return
            expiring = self._rows("messages_expiring_at", deadline=due)
            for message in expiring:
                self._answer_with_error(
                    message,
                    now,
                    ErrorCode.MESSAGE_UNAVAILABLE,
                    f"message expired: no reply within its TTL of {message['ttl']:g} s",
                )
            silent = self._rows("nodes_silent_at", deadline=due)
            for (node_id,) in silent:
                self._execute("set_offline", node_id=node_id)
                self._fail_open_messages(node_id, now, "node went offline: no heartbeat in time")
                self._events.append(partial(self._node_topic.publish, node_id, node_id))
            ending = self._rows("leases_ending_at", deadline=due)
            for message_id, node_id in ending:
                self._execute("end_lease", message_id=message_id)
                self._events.append(partial(self._message_topic.publish, node_id, node_id))
            if not (expiring or silent or ending):
                # Only a schema or query bug gets here; looping on would hang the link.
                raise StateError(f"no timer matches the deadline {due!r} that is due")

    async def _reap(self) -> None:
        while True:
            self._wakeup = anyio.Event()
            if self._clock.now() >= self._next_deadline:
                await self._transact(_nothing)
                continue
            self._sleeping_until = self._next_deadline
            delay = self._sleeping_until - self._clock.now()
            with self._clock.move_on_after(None if math.isinf(delay) else delay):
                await self._wakeup.wait()

    # Nodes -------------------------------------------------------------------------

    def _new_id(self, taken: str) -> int:
        while True:
            candidate = self._ids.getrandbits(63)
            if candidate > SERVER_NODE_ID and self._row(taken, id=candidate) is None:
                return candidate

    async def create_nodes(self, count: int, *, heartbeat_interval: float) -> list[int]:
        if count < 0:
            raise ValueError(f"cannot create {count} nodes")
        check_heartbeat_interval(heartbeat_interval)
        return await self._transact(partial(self._create_nodes, count, heartbeat_interval))

    def _create_nodes(self, count: int, heartbeat_interval: float, now: float) -> list[int]:
        online_until = now + self._patience * heartbeat_interval
        created = []
        for _ in range(count):
            node_id = self._new_id("node_id_taken")
            self._execute(
                "insert_node",
                node_id=node_id,
                heartbeat_interval=heartbeat_interval,
                online_until=online_until,
            )
            created.append(node_id)
            self._events.append(partial(self._node_topic.publish, node_id, node_id))
        self._watch(online_until)
        return created

    async def delete_node(self, node_id: int) -> None:
        await self._transact(partial(self._delete_node, node_id))

    def _delete_node(self, node_id: int, now: float) -> None:
        if node_id not in _INT64 or self._execute("delete_node", node_id=node_id) == 0:
            raise NodeNotFoundError(f"no node {node_id}")
        self._fail_open_messages(node_id, now, "node was deleted")
        self._events.append(partial(self._node_topic.publish, node_id, node_id))

    async def heartbeat(self, node_id: int, *, heartbeat_interval: float) -> None:
        check_heartbeat_interval(heartbeat_interval)
        await self._transact(partial(self._heartbeat, node_id, heartbeat_interval), durable=False)

    def _heartbeat(self, node_id: int, heartbeat_interval: float, now: float) -> None:
        node = self._row("node_online_flag", node_id=node_id) if node_id in _INT64 else None
        if node is None:
            raise NodeNotFoundError(f"no node {node_id}")
        # The timers fired first: a node past its deadline is offline by now.
        online_until = now + self._patience * heartbeat_interval
        self._execute(
            "heartbeat",
            node_id=node_id,
            heartbeat_interval=heartbeat_interval,
            online_until=online_until,
        )
        self._watch(online_until)
        if not node["online"]:
            self._events.append(partial(self._node_topic.publish, node_id, node_id))

    async def get_node_ids(self) -> list[int]:
        return await self._transact(self._get_node_ids)

    def _get_node_ids(self, now: float) -> list[int]:
        return [node_id for (node_id,) in self._rows("online_node_ids", now=now)]

    # Runs --------------------------------------------------------------------------

    async def create_run(self, run_config: dict[str, Any], *, seed: int | None = None) -> Run:
        if seed is not None and seed not in _INT64:
            raise ValueError(f"seed must fit in a signed 64-bit integer, got {seed}")
        config = ConfigRecord(run_config)
        packed = pack_recorddict(RecordDict({_RUN_CONFIG: config}))
        run_id = await self._transact(partial(self._create_run, packed, seed))
        return Run(run_id=run_id, run_config=dict(config), seed=seed)

    def _create_run(self, run_config: bytes, seed: int | None, now: float) -> int:
        run_id = self._new_id("run_id_taken")
        self._execute(
            "insert_run",
            run_id=run_id,
            run_config=run_config,
            status=RunStatus.PENDING.value,
            seed=seed,
        )
        return run_id

    async def get_run(self, run_id: int) -> Run:
        return await self._transact(lambda now: self._get_run(run_id))

    def _get_run(self, run_id: int) -> Run:
        row = self._row("get_run", run_id=run_id) if run_id in _INT64 else None
        if row is None:
            raise RunNotFoundError(f"no run {run_id}")
        config = unpack_recorddict(row["run_config"]).config_records[_RUN_CONFIG]
        return Run(
            row["run_id"], dict(config), RunStatus(row["status"]), row["reason"], row["seed"]
        )

    def _run_status(self, run_id: int) -> RunStatus:
        row = self._row("run_status", run_id=run_id) if run_id in _INT64 else None
        if row is None:
            raise RunNotFoundError(f"no run {run_id}")
        return RunStatus(row["status"])

    async def update_run_status(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        return await self._transact(partial(self._update_run_status, run_id, status, reason))

    def _update_run_status(self, run_id: int, status: RunStatus, reason: str, now: float) -> Run:
        run = self._get_run(run_id)
        run.status, run.reason = transition(run.status, status), reason
        self._execute("update_run_status", run_id=run_id, status=status.value, reason=reason)
        if status.finished:
            self._execute("delete_run_messages", run_id=run_id)
        return run

    # The ServerApp's side ------------------------------------------------------------

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        return await self._transact(partial(self._push_messages, run_id, list(messages)))

    def _push_messages(self, run_id: int, messages: list[Message], now: float) -> list[str]:
        status = self._run_status(run_id)
        if status.finished:
            raise RunFinishedError(f"run {run_id} is {status}; it takes no messages")
        for message in messages:
            if message.metadata.dst_node_id not in _INT64:
                raise ValueError(
                    f"dst_node_id must fit in a signed 64-bit integer, "
                    f"got {message.metadata.dst_node_id}"
                )
        contents = [pack_recorddict(message.content) for message in messages]
        ids = []
        for message, content in zip(messages, contents, strict=True):
            meta = message.metadata
            meta.run_id, meta.src_node_id, meta.created_at = run_id, SERVER_NODE_ID, now
            meta.message_id = self._new_message_id()
            self._execute(
                "insert_message",
                message_id=meta.message_id,
                run_id=run_id,
                dst_node_id=meta.dst_node_id,
                message_type=meta.message_type,
                group_id=meta.group_id,
                created_at=now,
                ttl=meta.ttl,
                expires_at=meta.expires_at,
                content=content,
            )
            ids.append(meta.message_id)
            if self._row("node_is_online", node_id=meta.dst_node_id, now=now) is None:
                self._answer_with_error(
                    _message_row(meta),
                    now,
                    ErrorCode.NODE_UNAVAILABLE,
                    f"node {meta.dst_node_id} is not online",
                )
                continue
            self._watch(meta.expires_at)
            self._events.append(
                partial(self._message_topic.publish, meta.dst_node_id, meta.dst_node_id)
            )
        return ids

    def _new_message_id(self) -> str:
        while True:
            message_id = f"{self._ids.getrandbits(128):032x}"
            if self._row("message_id_taken", id=message_id) is None:
                return message_id

    async def get_replies(self, run_id: int, message_ids: Iterable[str]) -> list[Message]:
        return await self._transact(partial(self._get_replies, run_id, list(message_ids)))

    def _get_replies(self, run_id: int, message_ids: list[str], now: float) -> list[Message]:
        self._run_status(run_id)
        replies = []
        for message_id in message_ids:
            row = self._row("message_and_reply", message_id=message_id)
            if row is None or row["run_id"] != run_id:
                replies.append(unknown_message_reply(run_id, message_id))
            elif row["reply_id"] is not None:
                replies.append(_reply_from(row))
        return replies

    async def ack_replies(self, run_id: int, message_ids: Iterable[str]) -> None:
        await self._transact(partial(self._ack_replies, run_id, list(message_ids)))

    def _ack_replies(self, run_id: int, message_ids: list[str], now: float) -> None:
        self._run_status(run_id)
        known: dict[str, None] = {}
        for message_id in message_ids:
            row = self._row("message_and_reply", message_id=message_id)
            if row is None or row["run_id"] != run_id:
                continue
            # Check them all before deleting any: a refused ack changes nothing.
            transition(MessageStatus(row["status"]), MessageStatus.ACKNOWLEDGED)
            known[message_id] = None
        for message_id in known:
            self._execute("delete_message", message_id=message_id)

    # The node's side -----------------------------------------------------------------

    async def pull_messages(
        self, node_id: int, *, limit: int | None = None, lease: float | None = None
    ) -> list[Message]:
        return await self._transact(partial(self._pull_messages, node_id, limit, lease))

    def _pull_messages(
        self, node_id: int, limit: int | None, lease: float | None, now: float
    ) -> list[Message]:
        if node_id not in _INT64 or self._row("node_online_flag", node_id=node_id) is None:
            raise NodeNotFoundError(f"no node {node_id}")
        rows = self._rows(
            "pending_messages_of_node",
            node_id=node_id,
            limit=-1 if limit is None else max(limit, 0),  # SQLite: a negative LIMIT is none
        )
        lease_until = None if lease is None else now + lease
        for row in rows:
            transition(MessageStatus.PENDING, MessageStatus.LEASED)
            self._execute("lease_message", message_id=row["message_id"], lease_until=lease_until)
        if rows and lease_until is not None:
            self._watch(lease_until)
        return [_message_from(row) for row in rows]

    async def push_reply(self, node_id: int, reply: Message) -> str:
        return await self._transact(partial(self._push_reply, node_id, reply))

    def _push_reply(self, node_id: int, reply: Message, now: float) -> str:
        reply_to = reply.metadata.reply_to_message_id
        row = self._row("message_and_reply", message_id=reply_to)
        if row is None or row["dst_node_id"] != node_id:
            raise MessageNotFoundError(f"node {node_id} has no message {reply_to!r} to reply to")
        if reply.metadata.message_type != row["message_type"]:
            raise ReplyRejectedError(
                f"reply type {reply.metadata.message_type!r} does not match "
                f"message type {row['message_type']!r}"
            )
        if row["reply_id"] is not None:
            return _repeated_reply(row, reply)
        transition(MessageStatus(row["status"]), MessageStatus.REPLIED)
        content = pack_recorddict(reply.content) if reply.has_content() else None
        error = reply.error if reply.has_error() else None
        meta = reply.metadata
        meta.run_id, meta.src_node_id, meta.dst_node_id = row["run_id"], node_id, SERVER_NODE_ID
        meta.group_id, meta.created_at = row["group_id"], now
        meta.ttl = min(meta.ttl, row["expires_at"] - now)
        meta.message_id = self._new_message_id()
        self._execute(
            "insert_reply",
            message_id=reply_to,
            reply_id=meta.message_id,
            src_node_id=node_id,
            created_at=now,
            ttl=meta.ttl,
            generated=False,
            error_code=None if error is None else error.code,
            error_reason=None if error is None else error.reason,
            content=content,
        )
        self._mark_replied(reply_to, meta.run_id)
        return meta.message_id

    def _mark_replied(self, message_id: str, run_id: int) -> None:
        self._execute("mark_replied", message_id=message_id)
        self._events.append(partial(self._reply_topic.publish, run_id, message_id))

    def _answer_with_error(
        self, message: sqlite3.Row | dict[str, Any], now: float, code: ErrorCode, reason: str
    ) -> None:
        """Store fedcore's error reply to an open message (its run, id, node and ttl)."""
        self._execute(
            "insert_reply",
            message_id=message["message_id"],
            reply_id=self._new_message_id(),
            src_node_id=message["dst_node_id"],
            created_at=now,
            ttl=message["ttl"],
            generated=True,
            error_code=int(code),
            error_reason=reason,
            content=None,
        )
        self._mark_replied(message["message_id"], message["run_id"])

    def _fail_open_messages(self, node_id: int, now: float, reason: str) -> None:
        for message in self._rows("open_messages_of_node", node_id=node_id):
            self._answer_with_error(
                message, now, ErrorCode.NODE_UNAVAILABLE, f"{reason} ({node_id})"
            )

    # Notifications ---------------------------------------------------------------

    def watch_messages(
        self, callback: Callable[[int], None], node_id: int | None = None
    ) -> Subscription:
        return self._message_topic.subscribe(callback, node_id)

    def watch_replies(self, run_id: int, callback: Callable[[str], None]) -> Subscription:
        return self._reply_topic.subscribe(callback, run_id)

    def watch_nodes(self, callback: Callable[[int], None]) -> Subscription:
        return self._node_topic.subscribe(callback)


def _nothing(now: float) -> None:
    """The work of a transaction that only fires the timers due."""


def _message_row(meta: Metadata) -> dict[str, Any]:
    """The columns of a stored message that an error reply to it is made from."""
    return {
        "message_id": meta.message_id,
        "run_id": meta.run_id,
        "dst_node_id": meta.dst_node_id,
        "ttl": meta.ttl,
    }


def _message_from(row: sqlite3.Row) -> Message:
    metadata = Metadata(
        run_id=row["run_id"],
        message_id=row["message_id"],
        src_node_id=SERVER_NODE_ID,
        dst_node_id=row["dst_node_id"],
        group_id=row["group_id"],
        created_at=row["created_at"],
        ttl=row["ttl"],
        message_type=row["message_type"],
    )
    return assemble_message(metadata, content=unpack_recorddict(row["content"]))


def _reply_from(row: sqlite3.Row) -> Message:
    """The reply of a ``message_and_reply`` row, stamped from the message it answers."""
    metadata = Metadata(
        run_id=row["run_id"],
        message_id=row["reply_id"],
        src_node_id=row["src_node_id"],
        dst_node_id=SERVER_NODE_ID,
        reply_to_message_id=row["message_id"],
        group_id=row["group_id"],
        created_at=row["created_at"],
        ttl=row["ttl"],
        message_type=row["message_type"],
    )
    if row["error_code"] is None:
        return assemble_message(metadata, content=unpack_recorddict(row["content"]))
    return assemble_message(metadata, error=Error(row["error_code"], row["error_reason"]))


def _repeated_reply(row: sqlite3.Row, reply: Message) -> str:
    """The stored reply's id if ``reply`` repeats it; else why it cannot be stored."""
    if row["generated"]:
        raise ReplyRejectedError(f"message already answered by fedcore: {row['error_reason']}")
    if row["error_code"] is None:
        same = reply.has_content() and unpack_recorddict(row["content"]) == reply.content
    else:
        same = reply.has_error() and reply.error == Error(row["error_code"], row["error_reason"])
    if not same:
        raise ConflictError(f"message {row['message_id']!r} already has a different reply")
    reply_id: str = row["reply_id"]
    return reply_id
