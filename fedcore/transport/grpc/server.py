"""The fleet API on gRPC: any :class:`~fedcore.transport.fleet.FleetService`, served by grpclib.

Each RPC handler is an adapter: it hands what arrived (the method, the metadata and
a reader of the first frame, capped before it is buffered:
:func:`~fedcore.transport.grpc.frames.receive`) to :func:`fedcore.auth.admission.admit`
with the link's :class:`~fedcore.auth.fleet_gate.FleetGate`, which admits the call's
signature or MAC before anything is decoded; then it decodes the frame with
:mod:`fedcore.wire.fleet`, has the gate check that the signer is the node the request
names, calls the service, and encodes its answer. Errors end the call
with a status, as ``fleet.proto`` says: AuthenticationError is UNAUTHENTICATED
(with its reason: nothing in it is secret; its class in the ``fedcore-error``
trailer, so that a node told of an unknown session signs again, and for a call
signed for another link the link's name in the ``fedcore-link`` trailer, so that the
node signs again for it); DecodeError is INVALID_ARGUMENT;
a NotFoundError is NOT_FOUND, with the error's class in the ``fedcore-error``
trailer so that the client raises the same one; LinkBusyError (a rate spent) is
RESOURCE_EXHAUSTED, with the seconds to wait in the ``fedcore-retry-after`` trailer;
anything else is logged here and
answered INTERNAL with no detail. Heartbeat and PushReply answer their expected
refusals (unknown node; the reject reasons) in the response instead.

Shutting down ends the calls in progress (a waiting pull among them) with
UNAVAILABLE, which a node retries, and closes the connections that made calls:
grpclib cancels handlers but leaves connections open, so the handlers note each
call's connection (grpclib's private ``Stream._stream``, as in ``frames``).

What a stranger may cost is bounded (docs/security.md, "Bounded cost"): each
method's request frames are capped by :data:`~fedcore.wire.rpc.REQUEST_CAPS`
before they are read, and must arrive within the body timeout; large ones are
decoded off the event loop (:func:`~fedcore.transport.off_loop.decoded`);
connections and call rates per peer, call rates per node key and registration
rates per peer and in all are kept within :class:`FleetLimits`
(:mod:`fedcore.transport.grpc.guard`), and refusals are logged once a minute.
"""

from __future__ import annotations

import logging
import socket
import ssl as _ssl
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import anyio
import grpclib.const
import grpclib.server
import h2.exceptions
from grpclib.protocol import Connection

from fedcore.auth.admission import Arrival, admit
from fedcore.auth.fleet_gate import Admission, FleetGate
from fedcore.auth.signatures import LINK
from fedcore.domain.fleet import PushedReply
from fedcore.errors import (
    AuthenticationError,
    ConflictError,
    DecodeError,
    FedcoreError,
    LinkBusyError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    WrongLinkError,
)
from fedcore.transport.connections import FloodLog
from fedcore.transport.fleet import FleetService, Transfer
from fedcore.transport.grpc.frames import (
    ERROR_TRAILER,
    RETRY_TRAILER,
    RawCodec,
    cardinality,
    receive,
)
from fedcore.transport.grpc.guard import (
    DEFAULT_FLEET_LIMITS,
    FleetLimits,
    GuardedServer,
    Rates,
)
from fedcore.transport.off_loop import decoded
from fedcore.wire import DEFAULT_LIMITS
from fedcore.wire import rpc as wire
from fedcore.wire.frame import MAX_DETAIL
from fedcore.wire.protobuf import FRAME_CAP
from fedcore.wire.rpc import REQUEST_CAPS, ChunkReader, ChunkWriter, FleetMethod

log = logging.getLogger(__name__)

_Stream = grpclib.server.Stream[bytes, bytes]
_T = TypeVar("_T")
_SHUTTING_DOWN = "the link is shutting down"
_GOODBYE_SECONDS = 1.0
"""How long a call cancelled by shutdown may take to tell its client so."""
_REJECTIONS = (
    DecodeError,
    NodeNotFoundError,
    MessageNotFoundError,
    ConflictError,
    ReplyRejectedError,
    RunFinishedError,
)


@dataclass(frozen=True, slots=True)
class FleetListener:
    """Where the fleet API listens: the port is the bound one, also when 0 was asked for."""

    host: str
    port: int


@asynccontextmanager
async def serve_fleet(
    service: FleetService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    gate: FleetGate,
    ssl: _ssl.SSLContext | None = None,
    frame_cap: int = FRAME_CAP,
    max_payload: int = DEFAULT_LIMITS.max_bytes,
    limits: FleetLimits = DEFAULT_FLEET_LIMITS,
) -> AsyncIterator[FleetListener]:
    """Serve ``service`` on ``host:port`` until the block ends; yield the bound address.

    ``gate`` admits each call (a node's signature) and checks whom it speaks for.
    ``frame_cap`` bounds every request frame (each method's own cap, lower, too),
    ``max_payload`` a pushed payload's declared size (checked on its first chunk),
    ``limits`` the connections, idleness, call rates and frame timeouts of peers.
    Leaving the block stops accepting connections and ends the calls in progress
    with UNAVAILABLE.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024)
    handlers = _FleetHandlers(service, gate, frame_cap, max_payload, limits)
    server = GuardedServer([handlers], codec=RawCodec(), limits=limits, flood=handlers.flood)
    try:
        await server.start(sock=sock, ssl=ssl, backlog=1024)
    except BaseException:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    log.info("fleet API listening on %s:%d", host, bound)
    try:
        yield FleetListener(host, bound)
    finally:
        handlers.closing = True
        server.close()  # stops listening and cancels the calls in progress: they end UNAVAILABLE
        await server.wait_closed()
        handlers.close_connections()


class _FleetHandlers:
    """grpclib's view of a FleetService: one handler per fleet method, all guarded."""

    def __init__(
        self,
        service: FleetService,
        gate: FleetGate,
        frame_cap: int,
        max_payload: int,
        limits: FleetLimits,
    ) -> None:
        self._service = service
        self._gate = gate
        self._cap = frame_cap
        self._max_payload = max_payload
        self._timeout = limits.body_timeout
        self._idle_timeout = limits.idle_timeout
        self._rates = Rates(limits.requests_per_second, limits.request_burst)
        self._key_rates = Rates(limits.requests_per_second_per_key, limits.request_burst_per_key)
        self._registrations = Rates(limits.registrations_per_second, limits.registration_burst)
        self._all_registrations = Rates(
            limits.registrations_per_second_total, limits.registration_burst_total
        )
        self.flood = FloodLog()
        self.closing = False
        """Set when the server shuts down: calls end UNAVAILABLE and reach no service."""
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()

    def close_connections(self) -> None:
        """Close every connection that made a call: grpclib's close() leaves them open."""
        for connection in list(self._connections):
            connection.close()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        methods: dict[FleetMethod, Callable[[_Stream], Awaitable[None]]] = {
            FleetMethod.REGISTER_NODE: self._register_node,
            FleetMethod.UNREGISTER_NODE: self._unregister_node,
            FleetMethod.HEARTBEAT: self._heartbeat,
            FleetMethod.HEARTBEATS: self._heartbeats,
            FleetMethod.PULL_MESSAGES: self._pull_messages,
            FleetMethod.PUSH_REPLY: self._push_reply,
            FleetMethod.GET_RUN: self._get_run,
            FleetMethod.GET_BUNDLE: self._get_bundle,
            FleetMethod.PUSH_PAYLOAD: self._push_payload,
            FleetMethod.PULL_PAYLOAD: self._pull_payload,
        }
        return {
            method.value: grpclib.const.Handler(
                self._guarded(method, func), cardinality(method), bytes, bytes
            )
            for method, func in methods.items()
        }

    def _guarded(
        self, method: FleetMethod, handler: Callable[[_Stream], Awaitable[None]]
    ) -> Callable[[_Stream], Awaitable[None]]:
        """``handler`` with fedcore's errors turned into statuses, and nothing else leaking."""

        async def guarded(stream: _Stream) -> None:
            self._connections.add(stream._stream.connection)  # grpclib exposes no other handle
            if self.closing:
                await _end(stream, grpclib.const.Status.UNAVAILABLE, _SHUTTING_DOWN)
                return
            try:
                self._admit(stream, method)
                await handler(stream)
            except LinkBusyError as exc:
                self.flood.warn("rate", "refused a %s call: %s", method.name, exc)
                await _end(
                    stream,
                    grpclib.const.Status.RESOURCE_EXHAUSTED,
                    f"too many requests: {exc}",
                    retry_after=exc.retry_after,
                )
            except WrongLinkError as exc:
                if not exc.learning:
                    self.flood.warn("wrong-link", "refused a %s call: %s", method.name, exc)
                if method is FleetMethod.REGISTER_NODE:
                    self._give_back_registration(stream)
                await _end(
                    stream,
                    grpclib.const.Status.UNAUTHENTICATED,
                    str(exc),
                    type(exc).__name__,
                    link=exc.link,
                )
            except AuthenticationError as exc:
                self.flood.warn("unauthenticated", "refused a %s call: %s", method.name, exc)
                await _end(
                    stream, grpclib.const.Status.UNAUTHENTICATED, str(exc), type(exc).__name__
                )
            except DecodeError as exc:
                self.flood.warn("invalid", "refused an invalid %s call: %s", method.name, exc)
                await _end(stream, grpclib.const.Status.INVALID_ARGUMENT, str(exc))
            except NotFoundError as exc:
                await _end(stream, grpclib.const.Status.NOT_FOUND, str(exc), type(exc).__name__)
            except anyio.get_cancelled_exc_class():
                if self.closing:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_GOODBYE_SECONDS):
                        await _end(stream, grpclib.const.Status.UNAVAILABLE, _SHUTTING_DOWN)
                raise
            except Exception:
                log.exception("fleet call %s failed", method.name)
                await _end(stream, grpclib.const.Status.INTERNAL, "internal error")

        return guarded

    def _admit(self, stream: _Stream, method: FleetMethod) -> None:
        """Raise LinkBusyError unless the call's peer is within its request rate and, for a
        registration, within its registration rate and the link within its own."""
        peer = stream.peer.addr()
        address = str(peer[0]) if peer else "?"
        if wait := self._rates.admit(address):
            raise LinkBusyError(f"{address} is over its request rate", retry_after=wait)
        if method is not FleetMethod.REGISTER_NODE:
            return
        if wait := self._registrations.admit(address):
            raise LinkBusyError(f"{address} is over its registration rate", retry_after=wait)
        if wait := self._all_registrations.admit(None):
            self._registrations.give_back(address)
            raise LinkBusyError("the link is over its registration rate", retry_after=wait)

    def _give_back_registration(self, stream: _Stream) -> None:
        """Return the registration tokens of a call refused for naming another link: it
        registered nothing and cost no signature check, and a node's first registration
        is refused so once, to learn the link's name."""
        peer = stream.peer.addr()
        self._registrations.give_back(str(peer[0]) if peer else "?")
        self._all_registrations.give_back(None)

    def _admit_key(self, admission: Admission) -> None:
        """Raise LinkBusyError unless the node key that signed the call is within its rate."""
        if wait := self._key_rates.admit(admission.public_key.der):
            raise LinkBusyError(
                f"node key {admission.public_key.fingerprint} is over its request rate",
                retry_after=wait,
            )

    async def _request(self, stream: _Stream, method: FleetMethod) -> tuple[bytes, Admission]:
        """The call's first frame, once the gate admitted the signature (or MAC) over it;
        the gate's admission (the node key it proved, the session).

        The gate reads the signature from the headers before any of the frame; the frame
        is read under the method's own cap and within the body timeout. The answer to a
        session offer goes out at once, in the response's headers.
        """
        cap = min(self._cap, REQUEST_CAPS[method])

        async def first_frame() -> bytes:
            frame = await receive(stream, cap, self._timeout)
            if frame is None:
                raise DecodeError("the call carried no request")
            return frame

        arrival = Arrival(method.value, stream.metadata or {}, first_frame)
        frame, admission = await admit(self._gate, arrival)
        self._admit_key(admission)
        if admission.headers:
            await stream.send_initial_metadata(metadata=admission.headers)
        return frame, admission

    async def _node_request(
        self, stream: _Stream, method: FleetMethod, decode: Callable[[bytes], _T]
    ) -> _T:
        """The decoded request of a call about a node, once the gate let its signer speak for it.

        ``decode`` returns the node id, or a tuple of the node id and the rest.
        """
        frame, admission = await self._request(stream, method)
        request = await decoded(decode, frame)
        node_id = request[0] if isinstance(request, tuple) else request
        assert isinstance(node_id, int), "a node request decodes to its node id first"
        await self._gate.check_speaks_for(admission.public_key, node_id)
        return request

    async def _register_node(self, stream: _Stream) -> None:
        frame, admission = await self._request(stream, FleetMethod.REGISTER_NODE)
        node_config, interval = await decoded(wire.decode_register_node_request, frame)
        key = admission.public_key
        node_id = await self._service.register_node(node_config, interval, key.der)
        self._gate.registered(key, node_id)
        await stream.send_message(wire.encode_register_node_response(node_id))

    async def _unregister_node(self, stream: _Stream) -> None:
        node_id = await self._node_request(
            stream, FleetMethod.UNREGISTER_NODE, wire.decode_unregister_node_request
        )
        await self._service.unregister_node(node_id)
        await stream.send_message(wire.encode_unregister_node_response())

    async def _heartbeat(self, stream: _Stream) -> None:
        request = await self._node_request(
            stream, FleetMethod.HEARTBEAT, wire.decode_heartbeat_request
        )
        await stream.send_message(await self._beat(*request))

    async def _heartbeats(self, stream: _Stream) -> None:
        """Heartbeats on one call: each frame MAC'd in the call's session, each answered.

        The frames after the first wait up to the idle timeout, not the body
        timeout: a node sends one per heartbeat interval. Each counts against the
        peer's and the key's request rates as a call would.
        """
        frame, admission = await self._request(stream, FleetMethod.HEARTBEATS)
        cap = min(self._cap, REQUEST_CAPS[FleetMethod.HEARTBEATS])
        number = 0
        while True:
            encoded, mac = wire.decode_heartbeat_frame(frame)
            self._gate.check_frame(admission, number, encoded, mac)
            request = wire.decode_heartbeat_request(encoded)
            await self._gate.check_speaks_for(admission.public_key, request[0])
            await stream.send_message(await self._beat(*request))
            next_frame = await receive(stream, cap, self._idle_timeout)
            if next_frame is None:
                return
            self._admit(stream, FleetMethod.HEARTBEATS)
            self._gate.check_session(admission)
            self._admit_key(admission)
            frame, number = next_frame, number + 1

    async def _beat(
        self, node_id: int, interval: float, ids: list[str], lease: float | None
    ) -> bytes:
        """The encoded answer to one heartbeat."""
        try:
            released = await self._service.heartbeat(node_id, interval, ids, lease)
        except NodeNotFoundError:
            return wire.encode_heartbeat_response(known=False)
        return wire.encode_heartbeat_response(known=True, released=released)

    async def _pull_messages(self, stream: _Stream) -> None:
        node_id, limit, lease, wait = await self._node_request(
            stream, FleetMethod.PULL_MESSAGES, wire.decode_pull_messages_request
        )
        pulled = await self._service.pull_messages(node_id, limit, lease, wait)
        frame, sent = wire.encode_pull_messages_response(pulled)
        if sent < len(pulled.messages):
            log.warning(
                "node %d leased %d messages, %d fit in one frame; the rest come again after "
                "their leases",
                node_id,
                len(pulled.messages),
                sent,
            )
        await stream.send_message(frame)

    async def _push_reply(self, stream: _Stream) -> None:
        node_id, reply, payload = await self._node_request(
            stream, FleetMethod.PUSH_REPLY, wire.decode_push_reply_request
        )
        outcome: PushedReply | FedcoreError
        try:
            outcome = await self._service.push_reply(node_id, reply, payload)
        except _REJECTIONS as exc:
            outcome = exc
        await stream.send_message(wire.encode_push_reply_response(outcome))

    async def _get_run(self, stream: _Stream) -> None:
        node_id, run_id = await self._node_request(
            stream, FleetMethod.GET_RUN, wire.decode_get_run_request
        )
        run, bundle = await self._service.get_run(node_id, run_id)
        await stream.send_message(wire.encode_get_run_response(run, bundle))

    async def _get_bundle(self, stream: _Stream) -> None:
        node_id, run_id = await self._node_request(
            stream, FleetMethod.GET_BUNDLE, wire.decode_get_bundle_request
        )
        async with self._service.get_bundle(node_id, run_id) as transfer:
            await _send_transfer(stream, transfer)

    async def _pull_payload(self, stream: _Stream) -> None:
        node_id, payload_id = await self._node_request(
            stream, FleetMethod.PULL_PAYLOAD, wire.decode_pull_payload_request
        )
        async with self._service.pull_payload(node_id, payload_id) as transfer:
            await _send_transfer(stream, transfer)

    async def _push_payload(self, stream: _Stream) -> None:
        reader = ChunkReader(max_size=self._max_payload)
        frame, admission = await self._request(stream, FleetMethod.PUSH_PAYLOAD)
        first = await decoded(reader.upload, frame)
        done = False

        cap = min(self._cap, REQUEST_CAPS[FleetMethod.PUSH_PAYLOAD])

        async def chunks() -> AsyncGenerator[bytes, None]:
            nonlocal done
            yield first
            while (frame := await receive(stream, cap, self._timeout)) is not None:
                yield await decoded(reader.upload, frame)
            reader.finish()
            done = True

        node_id, message_id = reader.upload_ids
        await self._gate.check_speaks_for(admission.public_key, node_id)
        async with aclosing(chunks()) as data:
            payload_id = await self._service.push_payload(node_id, message_id, reader.digest, data)
        if not done:
            raise RuntimeError("the fleet service returned before it had read the whole payload")
        await stream.send_message(wire.encode_push_payload_response(payload_id))


async def _send_transfer(stream: _Stream, transfer: Transfer) -> None:
    writer = ChunkWriter(transfer.digest)
    async for data in transfer.chunks:
        for frame in writer.frames(data):
            await stream.send_message(frame)
    for frame in writer.finish():
        await stream.send_message(frame)


async def _end(
    stream: _Stream,
    status: grpclib.const.Status,
    message: str,
    error: str | None = None,
    *,
    retry_after: float = 0.0,
    link: str | None = None,
) -> None:
    metadata = {ERROR_TRAILER: error} if error else {}
    if retry_after:
        metadata[RETRY_TRAILER] = f"{retry_after:.3f}"
    if link is not None:
        metadata[LINK] = link
    try:
        await stream.send_trailing_metadata(
            status=status, status_message=message[:MAX_DETAIL], metadata=metadata or None
        )
    except h2.exceptions.StreamClosedError:
        log.debug("the client left before the %s status was sent", status.name)
