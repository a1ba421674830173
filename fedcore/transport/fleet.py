"""The fleet API in domain terms: what a node asks of the link, whatever carries it.

:class:`FleetService` mirrors the Fleet RPCs of ``protos/fedcore/v1/fleet.proto``
with domain types. The link implements it over its LinkState; the gRPC server
(:mod:`fedcore.transport.grpc.server`) exposes any implementation on the network;
:class:`~fedcore.transport.grpc.client.GrpcFleetClient` implements it remotely, so a
node written against this interface runs the same against the link in-process, a
fake (``fedcore.testing.fleet``), or the network. Each method says what it raises;
a remote implementation raises the same errors, plus
:class:`~fedcore.errors.LinkUnavailableError` when the link cannot be reached.

Large data (app bundles, payloads) moves as a :class:`Transfer`: a digest known up
front and chunks that arrive one at a time, so no side holds more than a chunk
unless it wants the whole.

On the network every request is signed with the node's key, or MAC'd in a session,
and :mod:`fedcore.auth` decides, before anything of the request is decoded, whether
that admits it, and then whether the key it proves may speak for the node the request
names. The service itself trusts the ``node_id`` it is given: the transport has had
it checked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from fedcore.domain import Message, Run, UserConfigValue
from fedcore.domain.fleet import Digest, PayloadRef, PulledMessages, PushedReply
from fedcore.wire.frame import Buffer, slices

__all__ = ["Buffer", "FleetService", "Transfer", "each_chunk", "sliced"]


@dataclass(frozen=True, slots=True)
class Transfer:
    """An app bundle or payload on its way: its digest, then its bytes in order.

    Iterate ``chunks`` to the end: the last step checks the whole against
    ``digest`` and raises :class:`~fedcore.errors.DecodeError` if a chunk was
    corrupted, so bytes kept before then are not trustworthy yet.
    """

    digest: Digest
    chunks: AsyncIterator[Buffer]


async def each_chunk(chunks: AsyncIterable[Buffer] | Iterable[Buffer]) -> AsyncIterator[Buffer]:
    """The chunks of an upload, whether given as an iterable or an async iterable."""
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
    else:
        for chunk in chunks:
            yield chunk


async def sliced(parts: Sequence[Buffer], chunk_size: int) -> AsyncIterator[Buffer]:
    """Views of ``parts`` at most ``chunk_size`` bytes long, in order; nothing is copied.

    An empty transfer is one empty chunk, so that its receiver still gets a frame.
    """
    sent = False
    for chunk in slices(parts, chunk_size):
        sent = True
        yield chunk
    if not sent:
        yield memoryview(b"")


class FleetService(ABC):
    """The link's side of the fleet API. ``node_id`` is the node a request speaks for.

    "Not found" covers things that exist but are not the asking node's: the two
    look the same (docs/security.md). Lookups raise subclasses of
    :class:`~fedcore.errors.NotFoundError`; a request that breaks a rule of the
    fleet API raises :class:`~fedcore.errors.DecodeError`.
    """

    @abstractmethod
    async def register_node(
        self,
        node_config: Mapping[str, UserConfigValue],
        heartbeat_interval: float,
        public_key: bytes | None = None,
    ) -> int:
        """Create a node, online from now on, and return its id (positive, 63-bit).

        ``heartbeat_interval`` is positive and finite: the node is offline once
        patience × interval passes without a heartbeat. ``public_key`` is the
        registering node's (DER), as the transport authenticated it: a node that
        registers again with its key gets its id back. A remote client signs with the
        key it was made with, and takes none here.
        """

    @abstractmethod
    async def unregister_node(self, node_id: int) -> None:
        """Remove a node for good; its unanswered messages get error replies (code 5).

        An unknown node is no error, so a retry after a lost response is harmless.
        """

    @abstractmethod
    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        """Mark the node alive and extend the leases of the messages it works on.

        Returns those of ``working_message_ids`` whose lease was not extended
        (expired, run finished, answered by the link): the node may drop them.
        ``lease_seconds`` is required when ``working_message_ids`` is not empty.
        Raises ``NodeNotFoundError`` for a node that is unknown, unregistered or
        deleted: its id is dead and it must register again.
        """

    @abstractmethod
    async def pull_messages(
        self,
        node_id: int,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> PulledMessages:
        """Lease up to ``limit`` of the node's pending messages, oldest first.

        Each stays leased for ``lease_seconds`` (``None``: the link's default) and
        is delivered again if its lease runs out unanswered. With none pending,
        waits up to ``wait_seconds`` and returns as soon as one arrives (never by
        polling), or with none. Returns the link's clock too: lease deadlines are
        on it. A message whose content is too large to send inline comes with a
        :class:`PayloadRef` instead (see :class:`LeasedMessage`). The messages
        returned must fit one frame together; a transport may deliver a prefix,
        and the rest come again when their leases run out. Raises
        ``NodeNotFoundError`` for an unknown node.
        """

    @abstractmethod
    async def push_reply(
        self, node_id: int, reply: Message, payload: PayloadRef | None = None
    ) -> PushedReply:
        """Store the node's reply; with ``payload``, its content is that pushed payload.

        Pushing an identical reply again returns the first one's id with
        ``duplicate=True``. Refusals raise, one error per reason the wire knows:
        ``DecodeError`` (invalid reply, unknown payload), ``NodeNotFoundError``,
        ``MessageNotFoundError`` (no such message addressed to the node),
        ``ConflictError`` (a different reply is stored), ``ReplyRejectedError``
        (the message expired or was answered by the link) and ``RunFinishedError``.
        """

    @abstractmethod
    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        """The run and its app bundle's digest.

        Raises ``NodeNotFoundError``, or ``RunNotFoundError`` for a run the node
        has no messages of.
        """

    @abstractmethod
    def get_bundle(self, node_id: int, run_id: int) -> AbstractAsyncContextManager[Transfer]:
        """The run's app bundle, streamed: ``async with service.get_bundle(...) as t``.

        Entering raises ``NodeNotFoundError`` or ``RunNotFoundError`` as
        :meth:`get_run` does; leaving early abandons the transfer.
        """

    @abstractmethod
    async def push_payload(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: AsyncIterable[Buffer] | Iterable[Buffer],
    ) -> str:
        """Store the content of the node's reply to ``message_id``; return its payload id.

        ``chunks`` are the bytes in order and add up to ``digest``; nothing is kept
        unless they do (``DecodeError``, also for a digest over the link's cap).
        Raises ``NodeNotFoundError``, or ``MessageNotFoundError`` when the message
        is not leased to the node.
        """

    @abstractmethod
    def pull_payload(self, node_id: int, payload_id: str) -> AbstractAsyncContextManager[Transfer]:
        """A payload of a message addressed to the node, streamed.

        Entering raises ``NodeNotFoundError``, or ``NotFoundError`` for a payload
        that is unknown or not the node's.
        """
