"""Message contents too large to travel inline, on their way through the link.

Downward (ServerApp → node), a content larger than
:data:`~fedcore.wire.fleet.MAX_INLINE_CONTENT` is leased out as a
:class:`~fedcore.domain.fleet.PayloadRef` and streamed by ``PullPayload``.
:class:`Outgoing` keeps the encoded parts (views of the arrays, not copies) under
their SHA-256, so a model sent to 500 nodes is encoded and hashed once, and
forgets them once no lease that handed them out is alive.

Upward (node → ServerApp), a node pushes a large reply's content first
(``PushPayload``) and then the reply naming it. :class:`Incoming` holds each pushed
payload, checked against its digest as it arrived, until the reply that names it
is stored or the payload's keep time passes — and only the last one pushed for a
leased message: a reply has one content, so a new push for the same message
replaces the one before, which is freed at once (a node cannot hoard the link's
storage by pushing again and again). It holds it in a
:class:`~fedcore.wire.spool.Spool`, not in memory: a reply's model costs the link
a chunk of memory while it arrives, and page cache after. Neither is durable: a
payload matters only until its reply is stored, and a node whose push was lost
pushes again.
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field

import anyio.to_thread

from fedcore.domain import RecordDict
from fedcore.domain.fleet import Digest
from fedcore.errors import DecodeError, NotFoundError
from fedcore.transport.fleet import each_chunk, sliced
from fedcore.wire import pack_recorddict_parts, parts_size
from fedcore.wire.chunks import CHUNK_SIZE
from fedcore.wire.frame import Buffer, Parts
from fedcore.wire.spool import Spool

INCOMING_KEEP = 600.0
"""Seconds a pushed payload waits for the reply that names it."""


@dataclass
class _Out:
    parts: Parts
    digest: Digest
    nodes: set[int] = field(default_factory=set)
    until: float = 0.0


class Outgoing:
    """Encoded contents handed out as payloads, by payload id (their SHA-256 in hex)."""

    def __init__(self, *, inline_limit: int, chunk_size: int = CHUNK_SIZE) -> None:
        self._inline_limit = inline_limit
        self._chunk_size = chunk_size
        self._payloads: dict[str, _Out] = {}
        # id(content) -> (a weak reference to it, its payload id or None if inline)
        self._known: dict[int, tuple[weakref.ref[RecordDict], str | None]] = {}

    async def offer(
        self, content: RecordDict, node_id: int, until: float
    ) -> tuple[str, Digest] | None:
        """The payload id and digest ``content`` travels as, or ``None`` if it goes inline.

        ``node_id`` may pull it until ``until`` (its lease's end).
        """
        payload_id = await self._payload_id(content)
        if payload_id is None:
            return None
        out = self._payloads[payload_id]
        out.nodes.add(node_id)
        out.until = max(out.until, until)
        return payload_id, out.digest

    async def _payload_id(self, content: RecordDict) -> str | None:
        """Encode and hash each content object once, while its payload is held."""
        known = self._known.get(id(content))
        same = known is not None and known[0]() is content
        if known is not None and same and (known[1] is None or known[1] in self._payloads):
            return known[1]
        payload_id = await self._encode(content)
        if not same:
            weakref.finalize(content, self._known.pop, id(content), None)
        self._known[id(content)] = (weakref.ref(content), payload_id)
        return payload_id

    async def _encode(self, content: RecordDict) -> str | None:
        parts = pack_recorddict_parts(content)
        if parts_size(parts) <= self._inline_limit:
            return None
        digest = await anyio.to_thread.run_sync(Digest.of, parts)  # megabytes: off the loop
        payload_id = digest.sha256.hex()
        self._payloads.setdefault(payload_id, _Out(parts, digest))
        return payload_id

    def forget_before(self, now: float) -> None:
        """Drop payloads whose every lease has ended."""
        for payload_id in [k for k, out in self._payloads.items() if out.until < now]:
            del self._payloads[payload_id]

    def open(self, node_id: int, payload_id: str) -> tuple[Digest, AsyncIterator[Buffer]]:
        """The payload's digest and chunks, if it was handed to ``node_id``."""
        out = self._payloads.get(payload_id)
        if out is None or node_id not in out.nodes:
            raise NotFoundError(f"no payload {payload_id!r} for node {node_id}")
        return out.digest, sliced(out.parts, self._chunk_size)


def _take(spool: Spool, hasher: hashlib._Hash, chunk: memoryview) -> None:
    spool.write(chunk)
    hasher.update(chunk)


@dataclass(frozen=True)
class _In:
    node_id: int
    message_id: str
    digest: Digest
    data: memoryview
    until: float


class Incoming:
    """Payloads pushed by nodes, each waiting for the reply that names it."""

    def __init__(self, *, max_size: int, keep: float = INCOMING_KEEP) -> None:
        self._max_size = max_size
        self._keep = keep
        self._payloads: dict[str, _In] = {}
        self._by_message: dict[tuple[int, str], str] = {}

    async def receive(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: AsyncIterable[Buffer] | Iterable[Buffer],
        now: float,
    ) -> str:
        """Take a payload in, checking size and hash as it comes; return its id.

        It replaces the one ``node_id`` pushed for ``message_id`` before, if any; one
        refused (over the cap, not matching its digest) is not kept at all.
        """
        if digest.size > self._max_size:
            raise DecodeError(
                f"a payload of {digest.size} bytes is over the cap of {self._max_size}"
            )
        hasher = hashlib.sha256()
        with Spool() as spool:
            async for chunk in each_chunk(chunks):
                view = memoryview(chunk).cast("B")
                if spool.size + len(view) > digest.size:
                    raise DecodeError(f"the payload runs past its declared {digest.size} bytes")
                # Megabytes a chunk: hashed and written off the event loop, which a
                # thousand nodes' heartbeats share (hashlib and the write let go of the GIL).
                await anyio.to_thread.run_sync(_take, spool, hasher, view)
            if spool.size != digest.size or hasher.digest() != digest.sha256:
                raise DecodeError("the payload's bytes do not match its digest")
            data = spool.mapped()
        for payload_id in [k for k, held in self._payloads.items() if held.until < now]:
            self._forget(payload_id)
        previous = self._by_message.get((node_id, message_id))
        if previous is not None:
            self._forget(previous)
        payload_id = uuid.uuid4().hex
        self._payloads[payload_id] = _In(node_id, message_id, digest, data, now + self._keep)
        self._by_message[node_id, message_id] = payload_id
        return payload_id

    def _forget(self, payload_id: str) -> None:
        held = self._payloads.pop(payload_id)
        self._by_message.pop((held.node_id, held.message_id), None)

    def take(self, node_id: int, message_id: str, payload_id: str, digest: Digest) -> memoryview:
        """The bytes of a payload the node pushed for ``message_id``; it is forgotten then."""
        held = self._payloads.get(payload_id)
        if held is None or (held.node_id, held.message_id, held.digest) != (
            node_id,
            message_id,
            digest,
        ):
            raise DecodeError(f"payload {payload_id!r} is not this reply's")
        self._forget(payload_id)
        return held.data
