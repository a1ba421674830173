"""The link's side of the fleet API: what nodes ask, answered from the LinkState.

:class:`LinkFleet` implements :class:`~fedcore.transport.fleet.FleetService` over a
:class:`~fedcore.state.base.LinkState`; the gRPC server exposes it. The decisions
are the state's (leases, replies, timers); this module adds what the network needs:

- A pull with nothing pending waits for the state's message notification (or a
  lease running out, which the state also announces) up to ``wait_seconds``: a
  node holds one long poll open and gets a message the moment it is pushed.
- Heartbeats carry the ids the node is working on; their leases are renewed with
  the heartbeat, so a long ClientApp keeps its message.
- Large contents go as payloads (:mod:`.payloads`), encoded once per content.
- A pushed reply's payload is decoded within ``max_value_len`` (``--max-value-bytes``):
  a str or bytes value longer than that is refused (``DecodeError``), and so is a
  header that decodes to more objects than the wire's budget; it is decoded in a
  worker thread (:func:`fedcore.transport.off_loop.decoded`), never on the loop the other
  nodes' calls share.
- A node sees only runs it has messages of, and bundles of those runs.
- The heartbeat interval a node declares is at most ``max_heartbeat_interval``
  (``--max-heartbeat-interval``): a larger one is refused, at registration and at
  each heartbeat, so that a node that stops beating goes offline within
  ``patience × max_heartbeat_interval`` whatever it declared. Refused, not clamped: a
  node told "online for 300 s" that beats every 3,600 s would be offline most of the
  time with no word of why; refused, its operator reads the bound at start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial

import fedcore.defaults as defaults
from fedcore.clock import Clock
from fedcore.domain import Message, Run, UserConfigValue
from fedcore.domain.fleet import Digest, LeasedMessage, PayloadRef, PulledMessages, PushedReply
from fedcore.domain.message import assemble_message
from fedcore.errors import DecodeError, MessageNotFoundError, NodeNotFoundError, RunNotFoundError
from fedcore.roles.link.payloads import Incoming, Outgoing
from fedcore.state.base import LinkState
from fedcore.state.waiting import look_until
from fedcore.transport.fleet import Buffer, FleetService, Transfer, sliced
from fedcore.transport.off_loop import decoded
from fedcore.wire import DEFAULT_LIMITS, MAX_VALUE_LEN, DecodeLimits, unpack_recorddict
from fedcore.wire.chunks import CHUNK_SIZE
from fedcore.wire.fleet import MAX_INLINE_CONTENT

log = logging.getLogger(__name__)

DEFAULT_LEASE = 30.0
"""Seconds a pulled message stays leased when the node does not say (heartbeats renew it)."""
MAX_HEARTBEAT_INTERVAL = defaults.MAX_HEARTBEAT_INTERVAL
"""The longest heartbeat interval a node may declare: with the default patience, a node
that stops beating is offline within 15 minutes (a fake that never beats, too)."""


class LinkFleet(FleetService):
    """The fleet API over ``state``; time from ``clock``."""

    def __init__(
        self,
        state: LinkState,
        clock: Clock,
        *,
        default_lease: float = DEFAULT_LEASE,
        inline_limit: int = MAX_INLINE_CONTENT,
        chunk_size: int = CHUNK_SIZE,
        max_payload: int = DEFAULT_LIMITS.max_bytes,
        max_value_len: int = MAX_VALUE_LEN,
        max_heartbeat_interval: float = MAX_HEARTBEAT_INTERVAL,
    ) -> None:
        self._state = state
        self._max_interval = max_heartbeat_interval
        self._clock = clock
        self._default_lease = default_lease
        self._chunk_size = chunk_size
        self._outgoing = Outgoing(inline_limit=inline_limit, chunk_size=chunk_size)
        self._incoming = Incoming(max_size=max_payload)
        self._limits = DecodeLimits(max_bytes=max_payload, max_value_len=max_value_len)
        self._runs_of_node: dict[int, set[int]] = {}
        self._bundle_digests: dict[str, Digest] = {}

    # Nodes -------------------------------------------------------------------------

    async def register_node(
        self,
        node_config: Mapping[str, UserConfigValue],
        heartbeat_interval: float,
        public_key: bytes | None = None,
    ) -> int:
        self._check_interval(heartbeat_interval)
        if public_key is None:
            node_id = await self._state.create_node(heartbeat_interval=heartbeat_interval)
        else:
            node_id = await self._state.register_node(
                public_key, heartbeat_interval=heartbeat_interval
            )
        log.info("node %d registered (%s)", node_id, _describe(node_config))
        return node_id

    async def unregister_node(self, node_id: int) -> None:
        try:
            await self._state.delete_node(node_id)
        except NodeNotFoundError:
            return
        self._runs_of_node.pop(node_id, None)
        log.info("node %d unregistered", node_id)

    def forget(self, node_ids: Iterable[int]) -> None:
        """Drop what the fleet keeps of nodes the state deleted (retired)."""
        for node_id in node_ids:
            self._runs_of_node.pop(node_id, None)

    def _check_interval(self, heartbeat_interval: float) -> None:
        if not (heartbeat_interval > 0 and math.isfinite(heartbeat_interval)):
            raise DecodeError(
                f"heartbeat_interval must be positive and finite, got {heartbeat_interval}"
            )
        if heartbeat_interval > self._max_interval:
            raise DecodeError(
                f"heartbeat_interval {heartbeat_interval:g} s is over the link's bound of "
                f"{self._max_interval:g} s (its --max-heartbeat-interval): heartbeat more often"
            )

    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        self._check_interval(heartbeat_interval)
        await self._state.heartbeat(node_id, heartbeat_interval=heartbeat_interval)
        if not working_message_ids:
            return []
        if lease_seconds is None:
            raise DecodeError("a heartbeat naming messages must say how long to lease them")
        return await self._state.renew_leases(node_id, working_message_ids, lease=lease_seconds)

    # Messages ------------------------------------------------------------------------

    async def pull_messages(
        self,
        node_id: int,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> PulledMessages:
        lease = self._default_lease if lease_seconds is None else lease_seconds
        messages = await look_until(
            self._clock,
            lambda wake: self._state.watch_messages(wake, node_id),
            lambda: self._state.pull_messages(node_id, limit=limit, lease=lease),
            bool,
            wait_seconds,
        )
        now = self._clock.now()
        self._outgoing.forget_before(now)
        leased = [await self._leased(node_id, m, now + lease) for m in messages]
        return PulledMessages(now, tuple(leased))

    async def _leased(self, node_id: int, message: Message, until: float) -> LeasedMessage:
        self._runs_of_node.setdefault(node_id, set()).add(message.metadata.run_id)
        offered = await self._outgoing.offer(message.content, node_id, until)
        payload = None if offered is None else PayloadRef(*offered)
        return LeasedMessage(message, until, payload)

    async def push_reply(
        self, node_id: int, reply: Message, payload: PayloadRef | None = None
    ) -> PushedReply:
        if payload is not None:
            if reply.has_error():
                raise DecodeError("an error reply carries no payload")
            data = self._incoming.take(
                node_id, reply.metadata.reply_to_message_id, payload.payload_id, payload.digest
            )
            content = await decoded(partial(unpack_recorddict, limits=self._limits), data)
            reply = assemble_message(reply.metadata, content=content)
        sent_id = reply.metadata.message_id
        reply_id = await self._state.push_reply(node_id, reply)
        # LinkState.push_reply stamps a reply it stores with a fresh id, and leaves an
        # identical retry as it came (a promise of the interface, in its conformance suite).
        return PushedReply(reply_id, duplicate=reply.metadata.message_id == sent_id)

    # Runs and bundles ----------------------------------------------------------------

    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        run = await self._visible_run(node_id, run_id)
        digest = self._bundle_digests.get(run.bundle_hash)
        if digest is None:
            _, digest = await self._bundle(run)
        return run, digest

    @asynccontextmanager
    async def get_bundle(self, node_id: int, run_id: int) -> AsyncIterator[Transfer]:
        run = await self._visible_run(node_id, run_id)
        data, digest = await self._bundle(run)
        yield Transfer(digest, sliced([data], self._chunk_size))

    async def _visible_run(self, node_id: int, run_id: int) -> Run:
        if run_id not in self._runs_of_node.get(node_id, ()):
            if not await self._known_node(node_id):
                raise NodeNotFoundError(f"no node {node_id}")
            raise RunNotFoundError(f"no run {run_id} for node {node_id}")
        return await self._state.get_run(run_id)

    async def _bundle(self, run: Run) -> tuple[bytes, Digest]:
        if not run.bundle_hash:
            raise RunNotFoundError(f"run {run.run_id} has no app bundle")
        data = await self._state.get_bundle(run.bundle_hash)
        # The state keeps a bundle under its SHA-256 (LinkState.put_bundle): no need to
        # hash up to 50 MiB again, and a node refuses bytes that do not match it.
        digest = Digest(len(data), bytes.fromhex(run.bundle_hash))
        return data, self._bundle_digests.setdefault(run.bundle_hash, digest)

    # Payloads ---------------------------------------------------------------------------

    async def push_payload(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: AsyncIterable[Buffer] | Iterable[Buffer],
    ) -> str:
        # Renewing the lease is the check that the message is leased to this node (and
        # gives the upload the link's default lease; the node's heartbeats go on renewing).
        if await self._state.renew_leases(node_id, [message_id], lease=self._default_lease):
            raise MessageNotFoundError(f"message {message_id!r} is not leased to node {node_id}")
        return await self._incoming.receive(node_id, message_id, digest, chunks, self._clock.now())

    @asynccontextmanager
    async def pull_payload(self, node_id: int, payload_id: str) -> AsyncIterator[Transfer]:
        if not await self._known_node(node_id):
            raise NodeNotFoundError(f"no node {node_id}")
        digest, chunks = self._outgoing.open(node_id, payload_id)
        yield Transfer(digest, chunks)

    async def _known_node(self, node_id: int) -> bool:
        try:
            await self._state.renew_leases(node_id, (), lease=self._default_lease)
        except NodeNotFoundError:
            return False
        return True


def _describe(node_config: Mapping[str, UserConfigValue]) -> str:
    return " ".join(f"{key}={value!r}" for key, value in node_config.items()) or "no node config"
