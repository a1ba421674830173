"""The SQLite LinkState: the link's state in one file, kept across restarts and crashes.

It keeps and schedules; what happens is :mod:`fedcore.state.ledger`'s, as in memory (the
conformance suites check both stores alike). The file's machinery — one connection off
the event loop, the calls that queue up committed together (each undone alone if it
fails) and judged at the time they arrived, ``synchronous=FULL`` commits, timers kept as
stored deadlines, fired before each call and by a reaper — is
:mod:`fedcore.state.database`. This module holds nodes, messages, replies and leases;
runs, claims, bundles, contexts and logs are :mod:`fedcore.state.sqlite_runs`; contents
are :mod:`fedcore.state.sqlite_contents`.

**Timers.** Those due at one instant fire in this order: expired messages get error
replies (code 3), silent nodes' open messages too (code 5), lapsed leases make their
messages pending again, runs whose claim ran out while ``starting`` go back to pending
(failed after :data:`~fedcore.state.ledger.MAX_CLAIM_ATTEMPTS` claims), and running runs
whose ServerApp went silent fail. A heartbeat counts at the time it arrived: one sent
in time keeps its node (or run) alive however long it then waits for its transaction.
Node and ServerApp heartbeats alone commit without syncing (``durable=False``): losing
the last ones in a crash costs nothing (see restarts), while a thousand nodes beating
once a second would otherwise be a thousand syncs a second.

**Restarts.** Expiries, leases and claims that passed while the link was down fire at
once on opening — a TTL is a promise to the ServerApp, whose own timeouts ran on, a
lapsed lease only makes a message deliverable again, and a lapsed claim only lets
another exec try. Heartbeat deadlines are the exception: nodes and ServerApps cannot
heartbeat a link that is down, so each node online and each watched ServerApp of a
running run gets a full ``patience × heartbeat_interval`` from the opening to show up
again, and one that does not is declared offline (its run failed) then, within the
usual bound. A stall of the link's own event loop is treated alike, for the deadlines
that passed during it (:mod:`fedcore.state.stalls`). Fencing tokens come from a stored
counter: never one handed out twice.

**One link per file.** Several processes may open a fresh file at once (migrations
take turns, see :mod:`fedcore.state.sql`), but the deadline cache and the notifications
(in-process, published on the event loop after the commit, as in the memory state)
assume that one state at a time writes the file.

**Bytes.** Metadata are columns; content is a RecordDict payload of
:mod:`fedcore.wire`, and so are a run's config (as a ConfigRecord, whose value types it
must have) and saved contexts. A message's or reply's content lives apart from its
row, stored once per distinct content and streamed in and out a piece at a time
(:mod:`fedcore.state.sqlite_contents`), so that a status change does not rewrite a
model and a model never sits whole in memory; saved contexts are streamed too. Ids
come from a ``random.Random`` that ``seed`` seeds, as in memory.
"""

from __future__ import annotations

import math
import os
import random
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Self

from fedcore.clock import Clock, SystemClock
from fedcore.domain import (
    SERVER_NODE_ID,
    Error,
    LogLine,
    Message,
    MessageStatus,
    Metadata,
    MetricsLine,
    RecordDict,
    Run,
    RunStatus,
)
from fedcore.domain.message import assemble_message
from fedcore.errors import NodeNotFoundError
from fedcore.state import ledger
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE, LinkState, RunClaim
from fedcore.state.database import INT64, Database
from fedcore.state.ledger import (
    Answer,
    check_heartbeat_interval,
    check_lease,
    check_retirement,
    new_id,
)
from fedcore.state.notify import Subscription, Topic
from fedcore.state.sqlite_contents import SqliteContents, digest_of
from fedcore.state.sqlite_runs import SqliteRuns
from fedcore.state.stalls import StallWatch


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
        stalls: StallWatch | None = None,
    ) -> None:
        if not 0 < heartbeat_patience < math.inf:
            raise ValueError(f"heartbeat_patience must be positive, got {heartbeat_patience}")
        self._db = Database(
            path,
            clock or SystemClock(),
            fire=self._fire,
            reopen=self._reopen,
            rearm=self._rearm,
            stalls=stalls,
        )
        self._ids = random.Random(seed)
        self._patience = heartbeat_patience
        self._runs = SqliteRuns(self._db, self._ids, heartbeat_patience)
        self._message_topic: Topic[int, int] = Topic()
        self._reply_topic: Topic[int, str] = Topic()
        self._node_topic: Topic[int, int] = Topic()
        self._contents = SqliteContents(self._db)

    async def __aenter__(self) -> Self:
        await self._db.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._db.__aexit__(exc_type, exc, tb)

    # Timers (in the thread of the transaction that finds them due) ----------------------

    def _fire(self, due: float, now: float) -> bool:
        expiring = self._db.rows("messages_expiring_at", deadline=due)
        for message in expiring:
            self._answer(message, now, ledger.expired(message["ttl"]))
        silent = self._db.rows("nodes_silent_at", deadline=due)
        for (node_id,) in silent:
            self._db.execute("set_offline", node_id=node_id)
            self._fail_open_messages(node_id, now, ledger.NODE_SILENT)
            self._db.notify(partial(self._node_topic.publish, node_id, node_id))
        ending = self._db.rows("leases_ending_at", deadline=due)
        for message_id, node_id, status in ending:
            status = ledger.lease_ends(MessageStatus(status))
            self._db.execute("end_lease", message_id=message_id, status=status.value)
            self._db.notify(partial(self._message_topic.publish, node_id, node_id))
        fired_runs = self._runs.fire(due, now)
        return bool(expiring or silent or ending) or fired_runs

    def _rearm(self, since: float, now: float) -> None:
        self._db.execute("rearm_nodes", since=since, now=now, patience=self._patience)
        self._db.execute("rearm_leases", since=since, now=now)
        self._runs.rearm(since, now)

    def _reopen(self, now: float) -> None:
        self._db.execute("extend_online_nodes", now=now, patience=self._patience)
        self._runs.reopen(now)

    # Nodes -------------------------------------------------------------------------

    def _new_node_id(self) -> int:
        return new_id(
            self._ids, lambda candidate: self._db.row("node_id_taken", id=candidate) is not None
        )

    async def create_nodes(self, count: int, *, heartbeat_interval: float) -> list[int]:
        if count < 0:
            raise ValueError(f"cannot create {count} nodes")
        check_heartbeat_interval(heartbeat_interval)
        return await self._db.transact(partial(self._create_nodes, count, heartbeat_interval))

    def _create_nodes(self, count: int, heartbeat_interval: float, now: float) -> list[int]:
        online_until = ledger.silent_at(now, self._patience, heartbeat_interval)
        created = []
        for _ in range(count):
            node_id = self._new_node_id()
            self._db.execute(
                "insert_node",
                node_id=node_id,
                heartbeat_interval=heartbeat_interval,
                online_until=online_until,
            )
            created.append(node_id)
            self._db.notify(partial(self._node_topic.publish, node_id, node_id))
        self._db.watch(online_until)
        return created

    async def register_node(self, public_key: bytes, *, heartbeat_interval: float) -> int:
        check_heartbeat_interval(heartbeat_interval)
        return await self._db.transact(partial(self._register_node, public_key, heartbeat_interval))

    def _register_node(self, public_key: bytes, heartbeat_interval: float, now: float) -> int:
        row = self._db.row("node_with_key", public_key=public_key)
        if row is not None:
            (node_id,) = row
            self._heartbeat(node_id, heartbeat_interval, now)
            return int(node_id)
        (node_id,) = self._create_nodes(1, heartbeat_interval, now)
        self._db.execute("bind_node_key", node_id=node_id, public_key=public_key)
        return node_id

    async def node_with_key(self, public_key: bytes) -> int:
        row = await self._db.transact(
            lambda now: self._db.row("node_with_key", public_key=public_key), durable=False
        )
        if row is None:
            raise NodeNotFoundError("no node has registered with this key")
        return int(row[0])

    async def delete_node(self, node_id: int) -> None:
        await self._db.transact(partial(self._delete_node, node_id))

    def _delete_node(self, node_id: int, now: float) -> None:
        if node_id not in INT64 or self._db.execute("delete_node", node_id=node_id) == 0:
            raise NodeNotFoundError(f"no node {node_id}")
        self._fail_open_messages(node_id, now, ledger.NODE_DELETED)
        self._db.notify(partial(self._node_topic.publish, node_id, node_id))

    async def retire_nodes(self, *, offline_for: float) -> list[int]:
        check_retirement(offline_for)
        return await self._db.transact(partial(self._retire_nodes, offline_for))

    def _retire_nodes(self, offline_for: float, now: float) -> list[int]:
        retired = [
            node_id for (node_id,) in self._db.rows("nodes_to_retire", before=now - offline_for)
        ]
        for node_id in retired:
            self._delete_node(node_id, now)
        return retired

    async def heartbeat(self, node_id: int, *, heartbeat_interval: float) -> None:
        check_heartbeat_interval(heartbeat_interval)
        await self._db.transact(
            partial(self._heartbeat, node_id, heartbeat_interval), durable=False
        )

    def _heartbeat(self, node_id: int, heartbeat_interval: float, now: float) -> None:
        if node_id not in INT64:
            raise NodeNotFoundError(f"no node {node_id}")
        # The timers fired first: a node past its deadline is offline by now.
        online_until = ledger.silent_at(now, self._patience, heartbeat_interval)
        params = {"heartbeat_interval": heartbeat_interval, "online_until": online_until}
        # Nearly every heartbeat is from a node online: one statement, as each one costs
        # the database's thread the GIL (see fedcore.state.database).
        if not self._db.execute("heartbeat_online", node_id=node_id, **params):
            if self._db.row("node_online_flag", node_id=node_id) is None:
                raise NodeNotFoundError(f"no node {node_id}")
            self._db.execute("heartbeat", node_id=node_id, **params)
            self._db.notify(partial(self._node_topic.publish, node_id, node_id))
        self._db.watch(online_until)

    async def get_node_ids(self) -> list[int]:
        return await self._db.transact(self._get_node_ids)

    def _get_node_ids(self, now: float) -> list[int]:
        return [node_id for (node_id,) in self._db.rows("online_node_ids", now=now)]

    # Runs, claims, bundles, contexts and logs: see fedcore.state.sqlite_runs --------

    async def create_run(
        self, run_config: dict[str, Any], *, seed: int | None = None, bundle_hash: str = ""
    ) -> Run:
        return await self._runs.create_run(run_config, seed=seed, bundle_hash=bundle_hash)

    async def list_runs(self) -> list[Run]:
        return await self._runs.list_runs()

    async def get_run(self, run_id: int) -> Run:
        return await self._runs.get_run(run_id)

    async def update_run_status(
        self, run_id: int, status: RunStatus, reason: str = "", *, token: int | None = None
    ) -> Run:
        return await self._runs.update_run_status(run_id, status, reason, token=token)

    def watch_runs(self, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_runs(callback)

    async def claim_runs(self, *, limit: int, lease: float) -> list[RunClaim]:
        return await self._runs.claim_runs(limit=limit, lease=lease)

    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        return await self._runs.renew_claim(run_id, token, lease=lease)

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        return await self._runs.start_run(run_id, token, heartbeat_interval=heartbeat_interval)

    async def heartbeat_run(self, run_id: int, *, heartbeat_interval: float) -> Run:
        return await self._runs.heartbeat_run(run_id, heartbeat_interval=heartbeat_interval)

    async def check_run_secret(self, run_id: int, secret: str) -> Run:
        return await self._runs.check_run_secret(run_id, secret)

    async def put_bundle(self, data: bytes) -> str:
        return await self._runs.put_bundle(data)

    async def get_bundle(self, bundle_hash: str) -> bytes:
        return await self._runs.get_bundle(bundle_hash)

    async def save_context(self, run_id: int, node_id: int, state: RecordDict) -> None:
        await self._runs.save_context(run_id, node_id, state)

    async def load_context(self, run_id: int, node_id: int) -> RecordDict:
        return await self._runs.load_context(run_id, node_id)

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> int:
        return await self._runs.append_logs(run_id, lines, batch=batch)

    async def get_logs(self, run_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        return await self._runs.get_logs(run_id, after=after, limit=limit)

    def watch_logs(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_logs(run_id, callback)

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> int:
        return await self._runs.append_metrics(run_id, documents, batch=batch)

    async def get_metrics(
        self, run_id: int, *, after: int = 0, limit: int = 1000
    ) -> list[MetricsLine]:
        return await self._runs.get_metrics(run_id, after=after, limit=limit)

    def watch_metrics(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._runs.watch_metrics(run_id, callback)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        await self._runs.put_artifact(run_id, name, content)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        return await self._runs.get_artifact(run_id, name)

    # The ServerApp's side ------------------------------------------------------------

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        return await self._db.transact(partial(self._push_messages, run_id, list(messages)))

    def _push_messages(self, run_id: int, messages: list[Message], now: float) -> list[str]:
        ledger.check_takes_messages(run_id, self._runs.status(run_id))
        for message in messages:
            if message.metadata.dst_node_id not in INT64:
                raise ValueError(
                    f"dst_node_id must fit in a signed 64-bit integer, "
                    f"got {message.metadata.dst_node_id}"
                )
        retried = self._retried(run_id, messages)
        new = [message for message in messages if message.metadata.message_id not in retried]
        digests = iter(self._contents.store_messages(new))
        ids = []
        for message in messages:
            meta = message.metadata
            if meta.message_id in retried:  # stored already: this push is a retry
                ids.append(meta.message_id)
                continue
            digest = next(digests)
            ledger.stamp_message(meta, run_id, now, meta.message_id or self._new_message_id())
            self._db.execute(
                "insert_message",
                message_id=meta.message_id,
                run_id=run_id,
                dst_node_id=meta.dst_node_id,
                message_type=meta.message_type,
                group_id=meta.group_id,
                created_at=now,
                ttl=meta.ttl,
                expires_at=meta.expires_at,
                content_sha256=digest,
            )
            ids.append(meta.message_id)
            online = self._db.row("node_is_online", node_id=meta.dst_node_id, now=now) is not None
            answer = ledger.on_arrival(meta.dst_node_id, online)
            if answer is not None:
                self._answer_to(meta, MessageStatus.PENDING, now, answer)
                continue
            self._db.watch(meta.expires_at)
            self._db.notify(
                partial(self._message_topic.publish, meta.dst_node_id, meta.dst_node_id)
            )
        return ids

    def _retried(self, run_id: int, messages: list[Message]) -> set[str]:
        """The ids the ServerApp chose that the run holds already; refuse bad or taken ones."""
        retried = set()
        for message in messages:
            chosen = message.metadata.message_id
            if not chosen:
                continue
            owner = self._db.row("message_id_owner", id=chosen)
            if ledger.check_chosen_id(run_id, chosen, None if owner is None else owner["run_id"]):
                retried.add(chosen)
        return retried

    def _new_message_id(self) -> str:
        return ledger.new_message_id(
            self._ids, lambda candidate: self._db.row("message_id_taken", id=candidate) is not None
        )

    async def get_replies(self, run_id: int, message_ids: Iterable[str] | None) -> list[Message]:
        asked = None if message_ids is None else list(message_ids)
        return await self._db.transact(partial(self._get_replies, run_id, asked))

    def _get_replies(self, run_id: int, message_ids: list[str] | None, now: float) -> list[Message]:
        self._runs.status(run_id)
        if message_ids is None:
            return [self._reply_from(row) for row in self._db.rows("replies_of_run", run_id=run_id)]
        replies = []
        for message_id in message_ids:
            row = self._db.row("message_and_reply", message_id=message_id)
            if row is None or row["run_id"] != run_id:
                replies.append(ledger.unknown_message_reply(run_id, message_id))
            elif row["reply_id"] is not None:
                replies.append(self._reply_from(row))
        return replies

    def _reply_from(self, row: sqlite3.Row) -> Message:
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
            content = self._contents.load(row["content_sha256"])
            return assemble_message(metadata, content=content)
        return assemble_message(metadata, error=Error(row["error_code"], row["error_reason"]))

    async def ack_replies(self, run_id: int, message_ids: Iterable[str]) -> None:
        await self._db.transact(partial(self._ack_replies, run_id, list(message_ids)))

    def _ack_replies(self, run_id: int, message_ids: list[str], now: float) -> None:
        self._runs.status(run_id)
        known: dict[str, None] = {}
        for message_id in message_ids:
            row = self._db.row("message_and_reply", message_id=message_id)
            if row is None or row["run_id"] != run_id:
                continue
            # Check them all before deleting any: a refused ack changes nothing.
            ledger.acknowledged(MessageStatus(row["status"]))
            known[message_id] = None
        for message_id in known:
            self._db.execute("delete_message", message_id=message_id)

    # The node's side -----------------------------------------------------------------

    async def renew_leases(
        self, node_id: int, message_ids: Sequence[str], *, lease: float
    ) -> list[str]:
        check_lease(lease)
        return await self._db.transact(
            partial(self._renew_leases, node_id, list(message_ids), lease)
        )

    def _check_node_known(self, node_id: int) -> None:
        """``NodeNotFoundError`` unless ``node_id`` is registered (online or not)."""
        if node_id not in INT64 or self._db.row("node_online_flag", node_id=node_id) is None:
            raise NodeNotFoundError(f"no node {node_id}")

    def _renew_leases(
        self, node_id: int, message_ids: list[str], lease: float, now: float
    ) -> list[str]:
        self._check_node_known(node_id)
        lease_until = now + lease
        released = [
            message_id
            for message_id in message_ids
            if self._db.execute(
                "renew_lease", message_id=message_id, node_id=node_id, lease_until=lease_until
            )
            == 0
        ]
        if len(released) < len(message_ids):
            self._db.watch(lease_until)
        return released

    async def pull_messages(
        self, node_id: int, *, limit: int | None = None, lease: float | None = None
    ) -> list[Message]:
        return await self._db.transact(partial(self._pull_messages, node_id, limit, lease))

    def _pull_messages(
        self, node_id: int, limit: int | None, lease: float | None, now: float
    ) -> list[Message]:
        self._check_node_known(node_id)
        rows = self._db.rows(
            "pending_messages_of_node",
            node_id=node_id,
            limit=-1 if limit is None else max(limit, 0),  # SQLite: a negative LIMIT is none
        )
        lease_until = None if lease is None else now + lease
        status = ledger.lease(MessageStatus.PENDING).value  # the rows are pending
        for row in rows:
            self._db.execute(
                "lease_message",
                message_id=row["message_id"],
                status=status,
                lease_until=lease_until,
            )
        if rows and lease_until is not None:
            self._db.watch(lease_until)
        return [_message_from(row, self._contents.load(row["content_sha256"])) for row in rows]

    async def push_reply(self, node_id: int, reply: Message) -> str:
        return await self._db.transact(partial(self._push_reply, node_id, reply))

    def _push_reply(self, node_id: int, reply: Message, now: float) -> str:
        row = self._db.row("message_and_reply", message_id=reply.metadata.reply_to_message_id)
        message = ledger.check_reply(
            node_id, None if row is None else _message_metadata(row, "message_"), reply
        )
        assert row is not None
        if row["reply_id"] is not None:
            answered = row["error_reason"] if row["generated"] else None
            same = _same_reply(row, reply)
            return ledger.repeated_reply(message.message_id, row["reply_id"], answered, same)
        status = ledger.replied(MessageStatus(row["status"]))
        content = self._contents.store(reply.content) if reply.has_content() else None
        ledger.stamp_reply(reply.metadata, message, now, self._new_message_id())
        self._store_reply(reply, status, content, generated=False)
        return reply.metadata.message_id

    def _store_reply(
        self, reply: Message, status: MessageStatus, content: bytes | None, *, generated: bool
    ) -> None:
        """Keep a stamped reply (its content stored already as ``content``); the message
        it answers goes ``status``."""
        meta = reply.metadata
        error = reply.error if reply.has_error() else None
        self._db.execute(
            "insert_reply",
            message_id=meta.reply_to_message_id,
            reply_id=meta.message_id,
            src_node_id=meta.src_node_id,
            created_at=meta.created_at,
            ttl=meta.ttl,
            generated=generated,
            error_code=None if error is None else error.code,
            error_reason=None if error is None else error.reason,
            content_sha256=content,
        )
        self._db.execute("mark_replied", message_id=meta.reply_to_message_id, status=status.value)
        self._db.notify(partial(self._reply_topic.publish, meta.run_id, meta.reply_to_message_id))

    def _answer(self, message: sqlite3.Row, now: float, answer: Answer) -> None:
        """Store fedcore's answer to an open message (a row of its columns and status)."""
        self._answer_to(_message_metadata(message), MessageStatus(message["status"]), now, answer)

    def _answer_to(
        self, message: Metadata, status: MessageStatus, now: float, answer: Answer
    ) -> None:
        replied = ledger.replied(status)
        reply = ledger.answer_reply(message, answer, now, self._new_message_id())
        self._store_reply(reply, replied, None, generated=True)

    def _fail_open_messages(self, node_id: int, now: float, why: str) -> None:
        for message in self._db.rows("open_messages_of_node", node_id=node_id):
            self._answer(message, now, ledger.node_gone(node_id, why))

    # Notifications ---------------------------------------------------------------

    def watch_messages(
        self, callback: Callable[[int], None], node_id: int | None = None
    ) -> Subscription:
        return self._message_topic.subscribe(callback, node_id)

    def watch_replies(self, run_id: int, callback: Callable[[str], None]) -> Subscription:
        return self._reply_topic.subscribe(callback, run_id)

    def watch_nodes(self, callback: Callable[[int], None]) -> Subscription:
        return self._node_topic.subscribe(callback)


def _message_metadata(row: sqlite3.Row, prefix: str = "") -> Metadata:
    """The metadata of a stored message, from its columns (``prefix``: ``message_`` in a
    ``message_and_reply`` row, whose ``created_at`` and ``ttl`` are the reply's too)."""
    return Metadata(
        run_id=row["run_id"],
        message_id=row["message_id"],
        src_node_id=SERVER_NODE_ID,
        dst_node_id=row["dst_node_id"],
        group_id=row["group_id"],
        created_at=row[f"{prefix}created_at"],
        ttl=row[f"{prefix}ttl"],
        message_type=row["message_type"],
    )


def _message_from(row: sqlite3.Row, content: RecordDict) -> Message:
    return assemble_message(_message_metadata(row), content=content)


def _same_reply(row: sqlite3.Row, reply: Message) -> bool:
    """Whether ``reply`` repeats the stored reply of a ``message_and_reply`` row."""
    if row["error_code"] is None:
        return reply.has_content() and digest_of(reply.content) == row["content_sha256"]
    return reply.has_error() and reply.error == Error(row["error_code"], row["error_reason"])
