"""An in-memory FleetService: the link's side of the fleet API in a few dicts, for tests.

:class:`FakeFleet` keeps the promises of :class:`~fedcore.transport.fleet.FleetService`
that a node relies on, simply: pulls lease messages and wait for new ones by event,
heartbeats extend leases, an identical reply is a duplicate and a different one a
conflict (messages and replies are stamped, and repeats judged, by the link's own rules,
:mod:`fedcore.state.ledger`), payloads are checked against their digest before they are
kept, and content over the inline limit goes out as a payload. A test plays the
ServerApp with :meth:`FakeFleet.add_run` and :meth:`FakeFleet.send`, and reads what
nodes did in :attr:`FakeFleet.nodes`, :attr:`FakeFleet.replies` and
:attr:`FakeFleet.payloads`. It is no LinkState: nodes never go offline by themselves,
and a waiting pull is woken by new messages, not by expiring leases.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from fedcore.clock import Clock, SystemClock
from fedcore.domain import Message, Run, UserConfigValue
from fedcore.domain.fleet import Digest, LeasedMessage, PayloadRef, PulledMessages, PushedReply
from fedcore.domain.message import assemble_message
from fedcore.errors import (
    DecodeError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.state.ledger import (
    NODE_DELETED,
    answer_reply,
    node_gone,
    repeated_reply,
    stamp_message,
    stamp_reply,
)
from fedcore.transport.fleet import Buffer, FleetService, Transfer, each_chunk, sliced
from fedcore.wire import DEFAULT_LIMITS, pack_recorddict_parts, parts_size
from fedcore.wire.chunks import CHUNK_SIZE
from fedcore.wire.fleet import MAX_INLINE_CONTENT


@dataclass
class FakeNode:
    """A registered node: what it said about itself, and when it last heartbeated."""

    node_config: dict[str, UserConfigValue]
    heartbeat_interval: float
    last_heartbeat: float


@dataclass
class StoredReply:
    """A reply as stored: stamped by the fleet, with the payload its content is, if any."""

    reply: Message
    payload: PayloadRef | None
    body: tuple[Any, ...]
    """What makes two replies identical: the error, or the content's SHA-256."""
    generated: bool = False
    """Whether the reply is fedcore's own answer (its node was unregistered)."""


@dataclass
class StoredPayload:
    """A payload's bytes as they came, and the message it belongs to."""

    message_id: str
    digest: Digest
    parts: Sequence[Buffer]


@dataclass
class _Entry:
    message: Message
    payload_id: str | None
    leased_until: float = -math.inf
    reply: StoredReply | None = field(default=None)


class FakeFleet(FleetService):
    """A FleetService in memory; time from ``clock``, leases ``default_lease`` s unless asked."""

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        default_lease: float = 30.0,
        chunk_size: int = CHUNK_SIZE,
        max_payload: int = DEFAULT_LIMITS.max_bytes,
    ) -> None:
        self.clock = clock or SystemClock()
        self.default_lease = default_lease
        self.chunk_size = chunk_size
        self.max_payload = max_payload
        self.nodes: dict[int, FakeNode] = {}
        self.keys: dict[bytes, int] = {}
        """The node each registered public key belongs to."""
        self.runs: dict[int, tuple[Run, bytes]] = {}
        self.replies: dict[str, StoredReply] = {}
        """Stored replies by the id of the message they answer."""
        self.payloads: dict[str, StoredPayload] = {}
        self._messages: dict[str, _Entry] = {}
        self._seen: set[tuple[int, int]] = set()
        self._arrived: dict[int, anyio.Event] = {}
        self._node_ids = itertools.count(1001)

    # The ServerApp's side, for tests ----------------------------------------------

    def add_run(self, run: Run, bundle: bytes = b"") -> None:
        """Make ``run`` known, with ``bundle`` as its app bundle."""
        self.runs[run.run_id] = (run, bundle)

    def send(self, run_id: int, message: Message) -> str:
        """Queue ``message`` for its node in run ``run_id``, stamped as the link would; its id.

        Content encoded to more than the inline limit is kept as a payload, and
        leased out with its reference.
        """
        if run_id not in self.runs:
            raise RunNotFoundError(f"no run {run_id}")
        metadata = replace(message.metadata)
        stamp_message(metadata, run_id, self.clock.now(), uuid.uuid4().hex)
        stamped = assemble_message(metadata, content=message.content)
        payload_id = None
        parts = pack_recorddict_parts(message.content)
        if parts_size(parts) > MAX_INLINE_CONTENT:
            payload_id = uuid.uuid4().hex
            self.payloads[payload_id] = StoredPayload(metadata.message_id, Digest.of(parts), parts)
        self._messages[metadata.message_id] = _Entry(stamped, payload_id)
        self._seen.add((metadata.dst_node_id, run_id))
        arrived = self._arrived.pop(metadata.dst_node_id, None)
        if arrived is not None:
            arrived.set()
        return metadata.message_id

    # FleetService -------------------------------------------------------------------

    async def register_node(
        self,
        node_config: Mapping[str, UserConfigValue],
        heartbeat_interval: float,
        public_key: bytes | None = None,
    ) -> int:
        known = self.keys.get(public_key) if public_key is not None else None
        if known is not None and known in self.nodes:
            self.nodes[known].heartbeat_interval = heartbeat_interval
            return known
        node_id = next(self._node_ids)
        self.nodes[node_id] = FakeNode(dict(node_config), heartbeat_interval, self.clock.now())
        if public_key is not None:
            self.keys[public_key] = node_id
        return node_id

    async def node_with_key(self, public_key: bytes) -> int:
        """The node registered with ``public_key`` (a gate's :class:`KeyBindings`)."""
        node_id = self.keys.get(public_key)
        if node_id is None or node_id not in self.nodes:
            raise NodeNotFoundError("no node has registered with this key")
        return node_id

    async def unregister_node(self, node_id: int) -> None:
        if self.nodes.pop(node_id, None) is None:
            return
        for message_id, entry in self._messages.items():
            if entry.message.metadata.dst_node_id == node_id and entry.reply is None:
                answer = node_gone(node_id, NODE_DELETED)
                reply = answer_reply(entry.message.metadata, answer, self.clock.now(), "")
                self._store(message_id, entry, reply, None, generated=True)

    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        node = self._node(node_id)
        now = self.clock.now()
        node.heartbeat_interval, node.last_heartbeat = heartbeat_interval, now
        released = []
        for message_id in working_message_ids:
            entry = self._messages.get(message_id)
            if entry is None or not self._open(entry, node_id, now) or entry.leased_until <= now:
                released.append(message_id)
            else:
                entry.leased_until = now + (lease_seconds or self.default_lease)
        return released

    async def pull_messages(
        self,
        node_id: int,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> PulledMessages:
        self._node(node_id)
        leased = self._lease(node_id, limit, lease_seconds)
        if not leased and wait_seconds > 0:
            with self.clock.move_on_after(wait_seconds):
                while not leased:
                    await self._arrived.setdefault(node_id, anyio.Event()).wait()
                    leased = self._lease(node_id, limit, lease_seconds)
        return PulledMessages(self.clock.now(), tuple(leased))

    async def push_reply(
        self, node_id: int, reply: Message, payload: PayloadRef | None = None
    ) -> PushedReply:
        self._node(node_id)
        message_id = reply.metadata.reply_to_message_id
        entry = self._messages.get(message_id)
        if entry is None or entry.message.metadata.dst_node_id != node_id:
            raise MessageNotFoundError(f"no message {message_id!r} for node {node_id}")
        run, _ = self.runs[entry.message.metadata.run_id]
        if run.status.finished:
            raise RunFinishedError(f"run {run.run_id} has finished")
        body = self._body(message_id, reply, payload)
        if entry.reply is not None:
            stored = entry.reply.reply
            answered = stored.error.reason if entry.reply.generated else None
            same = entry.reply.body == body
            stored_id = repeated_reply(message_id, stored.metadata.message_id, answered, same)
            return PushedReply(stored_id, duplicate=True)
        if entry.message.metadata.expires_at <= self.clock.now():
            raise ReplyRejectedError(f"message {message_id!r} expired")
        return PushedReply(self._store(message_id, entry, reply, payload), duplicate=False)

    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        run, bundle = self._run(node_id, run_id)
        return run, Digest.of([bundle])

    @asynccontextmanager
    async def get_bundle(self, node_id: int, run_id: int) -> AsyncIterator[Transfer]:
        _, bundle = self._run(node_id, run_id)
        yield Transfer(Digest.of([bundle]), sliced([bundle], self.chunk_size))

    async def push_payload(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: AsyncIterable[Buffer] | Iterable[Buffer],
    ) -> str:
        self._node(node_id)
        entry = self._messages.get(message_id)
        if entry is None or not self._open(entry, node_id, self.clock.now()):
            raise MessageNotFoundError(f"no open message {message_id!r} for node {node_id}")
        if digest.size > self.max_payload:
            raise DecodeError(f"a payload of {digest.size} bytes is over {self.max_payload}")
        parts = [data async for data in each_chunk(chunks)]
        if Digest.of(parts) != digest:
            raise DecodeError("the payload's bytes do not match its digest")
        payload_id = uuid.uuid4().hex
        self.payloads[payload_id] = StoredPayload(message_id, digest, parts)
        return payload_id

    @asynccontextmanager
    async def pull_payload(self, node_id: int, payload_id: str) -> AsyncIterator[Transfer]:
        self._node(node_id)
        payload = self.payloads.get(payload_id)
        entry = self._messages.get(payload.message_id) if payload else None
        if payload is None or entry is None or entry.message.metadata.dst_node_id != node_id:
            raise NotFoundError(f"no payload {payload_id!r} for node {node_id}")
        yield Transfer(payload.digest, sliced(payload.parts, self.chunk_size))

    # Inside ---------------------------------------------------------------------------

    def _node(self, node_id: int) -> FakeNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise NodeNotFoundError(f"no node {node_id}")
        return node

    def _run(self, node_id: int, run_id: int) -> tuple[Run, bytes]:
        self._node(node_id)
        if run_id not in self.runs or (node_id, run_id) not in self._seen:
            raise RunNotFoundError(f"no run {run_id} for node {node_id}")
        return self.runs[run_id]

    def _open(self, entry: _Entry, node_id: int, now: float) -> bool:
        """Whether the message is the node's and can still take a reply."""
        metadata = entry.message.metadata
        run, _ = self.runs[metadata.run_id]
        return (
            metadata.dst_node_id == node_id
            and entry.reply is None
            and metadata.expires_at > now
            and not run.status.finished
        )

    def _lease(self, node_id: int, limit: int, lease_seconds: float | None) -> list[LeasedMessage]:
        now = self.clock.now()
        until = now + (lease_seconds or self.default_lease)
        leased: list[LeasedMessage] = []
        for entry in self._messages.values():
            if len(leased) == limit:
                break
            if self._open(entry, node_id, now) and entry.leased_until <= now:
                entry.leased_until = until
                ref = None
                if entry.payload_id is not None:
                    ref = PayloadRef(entry.payload_id, self.payloads[entry.payload_id].digest)
                leased.append(LeasedMessage(entry.message, until, ref))
        return leased

    def _body(self, message_id: str, reply: Message, payload: PayloadRef | None) -> tuple[Any, ...]:
        if payload is not None:
            stored = self.payloads.get(payload.payload_id)
            if stored is None or stored.message_id != message_id or stored.digest != payload.digest:
                raise DecodeError(f"payload {payload.payload_id!r} is not this reply's")
            return ("content", payload.digest.sha256)
        if reply.has_error():
            return ("error", reply.error.code, reply.error.reason)
        return ("content", Digest.of(pack_recorddict_parts(reply.content)).sha256)

    def _store(
        self,
        message_id: str,
        entry: _Entry,
        reply: Message,
        payload: PayloadRef | None,
        *,
        generated: bool = False,
    ) -> str:
        metadata = replace(reply.metadata)
        stamp_reply(metadata, entry.message.metadata, self.clock.now(), uuid.uuid4().hex)
        body = reply.error if reply.has_error() else None
        content = None if body is not None else reply.content
        stamped = assemble_message(metadata, content=content, error=body)
        entry.reply = StoredReply(
            stamped, payload, self._body(message_id, reply, payload), generated
        )
        self.replies[message_id] = entry.reply
        return metadata.message_id
