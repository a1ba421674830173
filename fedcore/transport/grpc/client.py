"""The fleet API's client: a :class:`~fedcore.transport.fleet.FleetService` that is a link far away.

Each method encodes its request with :mod:`fedcore.wire.fleet`, makes the call on
grpclib's Channel — signed with the node's key over its first frame
(:mod:`fedcore.auth.signatures`) — and decodes the answer, so a node calls the link
exactly as it would call a service in its own process. Failures come back as
fedcore's errors: UNAUTHENTICATED as AuthenticationError, INVALID_ARGUMENT as
DecodeError, NOT_FOUND as the NotFoundError subclass the link named, and everything
that means "the link is not there now" (nothing listens, the connection broke,
UNAVAILABLE) as :class:`~fedcore.errors.LinkUnavailableError`, and "not now, too
many requests" (RESOURCE_EXHAUSTED) as its subclass :class:`~fedcore.errors.LinkBusyError`,
carrying the link's hint of how long to wait (its ``fedcore-retry-after`` trailer).
Deciding whether and when to try again is the node's business, not this module's.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from types import TracebackType
from typing import Self

import grpclib.client
import grpclib.const
from grpclib.exceptions import GRPCError, StreamTerminatedError

from fedcore.auth.keys import NodeKey
from fedcore.auth.sessions import ClientSession, Offer
from fedcore.auth.signatures import LINK, check_link_name, sign
from fedcore.auth.stamps import NO_LINK_YET
from fedcore.clock import Clock, SystemClock
from fedcore.domain import Message, Run, UserConfigValue
from fedcore.domain.fleet import Digest, PayloadRef, PulledMessages, PushedReply
from fedcore.errors import (
    AuthenticationError,
    DecodeError,
    FedcoreError,
    LinkBusyError,
    LinkUnavailableError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    RunNotFoundError,
    UnknownSessionError,
    WrongLinkError,
)
from fedcore.transport.fleet import Buffer, FleetService, Transfer, each_chunk
from fedcore.transport.grpc.frames import ERROR_TRAILER, RETRY_TRAILER, RawCodec, cardinality
from fedcore.transport.grpc.heartbeats import HeartbeatCall
from fedcore.wire import rpc as wire
from fedcore.wire.rpc import ChunkReader, ChunkWriter, FleetMethod

_Stream = grpclib.client.Stream[bytes, bytes]
_LINK_ERRORS = (GRPCError, StreamTerminatedError, OSError)
MAX_RETRY_HINT = 60.0
"""The longest wait a link's retry hint is taken at: a hint is the link's word, not a
reason to stay away for hours."""
_NOT_FOUND = {
    kind.__name__: kind
    for kind in (NotFoundError, RunNotFoundError, NodeNotFoundError, MessageNotFoundError)
}


class _Call:
    """One call's stream, and the exception of the caller's own code inside it, if any.

    The caller's code (a transfer's consumer, the source of pushed chunks) runs
    inside the call; its exceptions pass through untranslated, even an OSError.
    """

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.caller_error: BaseException | None = None


class GrpcFleetClient(FleetService):
    """The fleet API of the link at ``host:port``; use it as an async context manager.

    Every call is signed with ``key`` (a node passes its own, kept across restarts:
    the link knows the node by it; without one the client makes a key for its own
    life) and stamped with ``clock``'s time. The first signed call offers a session
    (:mod:`fedcore.auth.sessions`); once the link has answered, unary calls are
    MAC'd in it instead, at a fraction of the cost, and a call the link refuses as
    of an unknown session (it restarted) is signed and sent again. Every signature
    names the link it is meant for (:mod:`fedcore.auth.signatures`): the client learns
    the link's name from the link's refusal of its first call, and again after the
    link restarts, and sends that call again at once (a streamed call: raises
    LinkUnavailableError, which a node retries). Heartbeats in a
    session go on one long call (:mod:`~fedcore.transport.grpc.heartbeats`); a beat
    that fails there, or finds it busy with another, is sent as a call of its own.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: _ssl.SSLContext | None = None,
        key: NodeKey | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._host, self._port, self._ssl = host, port, ssl
        self.key = key or NodeKey.generate()
        self._clock = clock or SystemClock()
        self._channel: grpclib.client.Channel | None = None
        self._session: ClientSession | None = None
        self._link = NO_LINK_YET
        """The name of the link, as the link last said it (none before its first answer)."""
        self._offering = False
        """A call that offers a session is under way: the others sign without one."""
        self._sessions = True
        """False once the link answered an offer without a session: it does not hold any."""
        self._beats: HeartbeatCall | None = None
        self._beating = False
        """A heartbeat is on ``_beats`` now: another goes as a call of its own."""
        self._streamed_beats = True
        """False once the link answered UNIMPLEMENTED to a Heartbeats call."""

    async def __aenter__(self) -> Self:
        self._channel = grpclib.client.Channel(
            self._host, self._port, codec=RawCodec(), ssl=self._ssl
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._beats is not None:
            await self._beats.close()
            self._beats = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    async def register_node(
        self,
        node_config: Mapping[str, UserConfigValue],
        heartbeat_interval: float,
        public_key: bytes | None = None,
    ) -> int:
        if public_key not in (None, self.key.public.der):
            raise ValueError("a client registers with the key it signs with")
        request = wire.encode_register_node_request(node_config, heartbeat_interval)
        response = await self._unary(FleetMethod.REGISTER_NODE, request)
        return wire.decode_register_node_response(response)

    async def unregister_node(self, node_id: int) -> None:
        request = wire.encode_unregister_node_request(node_id)
        wire.decode_unregister_node_response(
            await self._unary(FleetMethod.UNREGISTER_NODE, request)
        )

    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        request = wire.encode_heartbeat_request(
            node_id, heartbeat_interval, working_message_ids, lease_seconds
        )
        response = await self._streamed_beat(request)
        if response is None:
            response = await self._unary(FleetMethod.HEARTBEAT, request)
        return wire.decode_heartbeat_response(response, node_id)

    async def pull_messages(
        self,
        node_id: int,
        limit: int = 1,
        lease_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> PulledMessages:
        request = wire.encode_pull_messages_request(node_id, limit, lease_seconds, wait_seconds)
        response = await self._unary(FleetMethod.PULL_MESSAGES, request)
        return wire.decode_pull_messages_response(response)

    async def push_reply(
        self, node_id: int, reply: Message, payload: PayloadRef | None = None
    ) -> PushedReply:
        request = wire.encode_push_reply_request(node_id, reply, payload)
        response = await self._unary(FleetMethod.PUSH_REPLY, request)
        return wire.decode_push_reply_response(response)

    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        request = wire.encode_get_run_request(node_id, run_id)
        return wire.decode_get_run_response(await self._unary(FleetMethod.GET_RUN, request))

    def get_bundle(self, node_id: int, run_id: int) -> AbstractAsyncContextManager[Transfer]:
        request = wire.encode_get_bundle_request(node_id, run_id)
        return self._download(FleetMethod.GET_BUNDLE, request)

    def pull_payload(self, node_id: int, payload_id: str) -> AbstractAsyncContextManager[Transfer]:
        request = wire.encode_pull_payload_request(node_id, payload_id)
        return self._download(FleetMethod.PULL_PAYLOAD, request)

    async def push_payload(
        self,
        node_id: int,
        message_id: str,
        digest: Digest,
        chunks: AsyncIterable[Buffer] | Iterable[Buffer],
    ) -> str:
        writer = ChunkWriter(digest, upload=(node_id, message_id))
        source = each_chunk(chunks)
        # The call is signed over its first frame, so that frame is made before the call;
        # the frames after it are made one at a time, as they are sent.
        frames: Iterator[bytes] = iter(())
        head = None
        while head is None:
            data = await anext(source, None)
            frames = iter(writer.finish()) if data is None else writer.frames(data)
            head = next(frames, None)
            if data is None:
                break
        assert head is not None, "a transfer has at least one frame"
        async with self._call(FleetMethod.PUSH_PAYLOAD, head) as call:
            await call.stream.send_message(head)
            for frame in frames:
                await call.stream.send_message(frame)
            while True:
                try:
                    data = await anext(source)
                except StopAsyncIteration:
                    break
                except BaseException as exc:
                    call.caller_error = exc
                    raise
                for frame in writer.frames(data):
                    await call.stream.send_message(frame)
            for frame in writer.finish():
                await call.stream.send_message(frame)
            await call.stream.end()
            response = await call.stream.recv_message()
        return wire.decode_push_payload_response(_present(response))

    # The calls ------------------------------------------------------------------------

    async def _streamed_beat(self, request: bytes) -> bytes | None:
        """The answer to ``request`` sent on the heartbeats call, or None if it should
        go as a call of its own: no session, a beat already on the call, or the call
        failed (a heartbeat is safe to send twice)."""
        session = self._current_session()
        if session is None or self._beating or not self._streamed_beats:
            return None
        self._beating = True
        try:
            call = self._beats
            if call is not None and (call.broken or call.session is not session):
                self._beats = None
                await call.close()
            if self._beats is None:
                if self._channel is None:
                    raise RuntimeError("GrpcFleetClient is used outside its `async with` block")
                self._beats = HeartbeatCall(self._channel, session, self._clock)
            call = self._beats
            try:
                return await call.beat(request)
            except _LINK_ERRORS as exc:
                if call.stream is not None:
                    _take_back_native_cancel(call.stream)
                    refused = self._translated(exc, call.stream)
                    if isinstance(refused, UnknownSessionError) and self._session is session:
                        self._session = None  # the call of its own signs, and offers anew
                if isinstance(exc, GRPCError) and exc.status is grpclib.const.Status.UNIMPLEMENTED:
                    self._streamed_beats = False
                return None
        finally:
            self._beating = False

    async def _unary(self, method: FleetMethod, request: bytes) -> bytes:
        """The answer to ``request``. A call refused before anything of it was read —
        its session unknown, or signed for the link's name before a restart — is
        sent again at once, signed (for the name the refusal told): at most twice, as
        after a restart both happen in turn."""
        session, tries_left = self._current_session(), 2
        while True:
            signed_for = self._link
            try:
                return await self._unary_once(method, request, session)
            except UnknownSessionError:
                if session is None or not tries_left:
                    raise
                if self._session is session:
                    self._session = None
                session = None
            except WrongLinkError:
                if self._link == signed_for or not tries_left:
                    raise
            tries_left -= 1

    async def _unary_once(
        self, method: FleetMethod, request: bytes, session: ClientSession | None
    ) -> bytes:
        async with self._call(method, request, session) as call:
            await call.stream.send_message(request, end=True)
            response = await call.stream.recv_message()
        return _present(response)

    def _current_session(self) -> ClientSession | None:
        session = self._session
        if session is not None and self._clock.now() >= session.renew_at:
            self._session = session = None
        return session

    @asynccontextmanager
    async def _download(self, method: FleetMethod, request: bytes) -> AsyncIterator[Transfer]:
        async with self._call(method, request) as call:
            stream = call.stream
            await stream.send_message(request, end=True)
            reader = ChunkReader()
            frame = await stream.recv_message()
            if frame is None:  # the link sent headers (a session's answer), then its status
                await stream.recv_trailing_metadata()
            first = reader.chunk(_present(frame))
            finished = False

            async def chunks() -> AsyncGenerator[Buffer, None]:
                nonlocal finished
                yield first
                while True:
                    try:
                        frame = await stream.recv_message()
                    except _LINK_ERRORS as exc:
                        _take_back_native_cancel(stream)
                        raise self._translated(exc, stream) from exc
                    if frame is None:
                        break
                    yield reader.chunk(frame)
                reader.finish()
                finished = True

            async with aclosing(chunks()) as data:
                try:
                    yield Transfer(reader.digest, data)
                except BaseException as exc:
                    call.caller_error = exc
                    raise
            if not finished:
                await stream.cancel()

    @asynccontextmanager
    async def _call(
        self, method: FleetMethod, first_frame: bytes, session: ClientSession | None = None
    ) -> AsyncIterator[_Call]:
        """A call to ``method`` whose first request frame will be ``first_frame``, MAC'd
        in ``session`` if given, else signed (offering a session if the client holds
        none and none is on the way)."""
        if self._channel is None:
            raise RuntimeError("GrpcFleetClient is used outside its `async with` block")
        now, offer = self._clock.now(), None
        if session is not None:
            metadata = session.metadata(method.value, first_frame, now)
        else:
            # A streamed call signs even in a session; it offers only if there is none,
            # so that it does not end the one the unary calls are using.
            if self._sessions and not self._offering and self._session is None:
                offer, self._offering = Offer(), True
            header = "" if offer is None else offer.header
            metadata = sign(self.key, method.value, first_frame, now, link=self._link, offer=header)
        stream = self._channel.request(
            method.value, cardinality(method), bytes, bytes, metadata=metadata
        )
        call, signed_for = _Call(stream), self._link
        try:
            async with stream:
                yield call
                if offer is not None:
                    self._accept(offer, stream)
        except _LINK_ERRORS as exc:
            if exc is call.caller_error:
                raise
            _take_back_native_cancel(stream)
            error = self._translated(exc, stream)
            if (
                isinstance(error, WrongLinkError)
                and self._link != signed_for
                and cardinality(method) is not grpclib.const.Cardinality.UNARY_UNARY
            ):
                raise LinkUnavailableError(
                    f"the link at {self._host}:{self._port} restarted since this node "
                    "last signed for it: the call goes again"
                ) from exc
            raise error from exc
        finally:
            if offer is not None:
                self._offering = False

    def _accept(self, offer: Offer, stream: _Stream) -> None:
        """Hold the session the link's answer to ``offer`` opened, if it opened one."""
        answer = {
            name: value
            for name, value in (stream.initial_metadata or {}).items()
            if isinstance(value, str)
        }
        session = offer.accept(answer, self.key.public.der, self._clock.now())
        if session is None:
            self._sessions = False
        else:
            self._session = session

    def _translated(self, exc: BaseException, stream: _Stream) -> FedcoreError:
        """The fedcore error for a failed call: what the status means, or the link being away."""
        where = f"the link at {self._host}:{self._port}"
        if not isinstance(exc, GRPCError):
            return LinkUnavailableError(f"{where} is unavailable: {type(exc).__name__}: {exc}")
        status, message = exc.status, exc.message or ""
        if status is grpclib.const.Status.UNAVAILABLE:
            return LinkUnavailableError(f"{where} is unavailable: {message}")
        if status is grpclib.const.Status.RESOURCE_EXHAUSTED:
            return LinkBusyError(
                f"{where} refused the call ({status.name}): {message}",
                retry_after=_retry_hint(stream),
            )
        if status is grpclib.const.Status.UNAUTHENTICATED:
            error = _trailer(stream, ERROR_TRAILER)
            if error == UnknownSessionError.__name__:
                return UnknownSessionError(f"{where} refused this node's session: {message}")
            if error == WrongLinkError.__name__:
                return self._told_link(_trailer(stream, LINK), f"{where} refused: {message}")
            return AuthenticationError(f"{where} refused this node: {message}")
        if status is grpclib.const.Status.INVALID_ARGUMENT:
            return DecodeError(f"{where} refused the request: {message}")
        if status is grpclib.const.Status.NOT_FOUND:
            return _NOT_FOUND.get(_trailer(stream, ERROR_TRAILER), NotFoundError)(message)
        return FedcoreError(f"{where} failed the call with {status.name}: {message}")

    def _told_link(self, link: str, refusal: str) -> WrongLinkError:
        """The refusal of a call signed for another link's name; the name the link goes
        by is learned, if the refusal says one of the right form."""
        try:
            self._link = check_link_name(link)
        except AuthenticationError:
            return WrongLinkError(f"{refusal} (and gave no name of its own)", self._link)
        return WrongLinkError(refusal, link)


def _take_back_native_cancel(stream: _Stream) -> None:
    """Undo the cancellation grpclib delivered to this task when the connection was lost.

    grpclib ends the calls of a lost connection by cancelling the tasks inside them
    natively (``Task.cancel``) and raising StreamTerminatedError in place of the
    CancelledError. On Python 3.11 that leaves the task's cancellation count
    raised: the task then looks cancelled to the next cancel scope it leaves, and a
    CancelledError escapes where it should have stopped — after a link restart, a
    node's main task left its work early and the node died. Its wrapper records
    whether it cancelled this task (``cancel_failed`` is False when the task left it
    with that CancelledError); then the request is taken back. This reads a private
    attribute of grpclib 0.4, pinned in pyproject.toml and checked by a test.
    """
    wrapper = stream._wrapper
    if wrapper is None or not wrapper.cancelled or wrapper.cancel_failed is not False:
        return
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()


def _trailer(stream: _Stream, name: str) -> str:
    """The trailer ``name`` of a failed call, or "" without one.

    grpclib fills ``trailing_metadata`` when it reads the status itself; when a
    send fails because the link ended the call early, it raises the status from
    the raw trailers (or trailers-only headers) of its HTTP/2 stream instead.
    """
    if stream.trailing_metadata is not None:
        return str(stream.trailing_metadata.get(name, ""))
    raw = stream._stream.trailers or stream._stream.headers or []
    return next((value for key, value in raw if key == name), "")


def _retry_hint(stream: _Stream) -> float:
    """The seconds a RESOURCE_EXHAUSTED answer said to wait (its ``fedcore-retry-after``
    trailer), at most :data:`MAX_RETRY_HINT`; 0.0 if it said nothing readable."""
    try:
        hint = float(_trailer(stream, RETRY_TRAILER) or 0.0)
    except ValueError:
        return 0.0
    return min(hint, MAX_RETRY_HINT) if hint > 0 else 0.0


def _present(frame: bytes | None) -> bytes:
    if frame is None:
        raise DecodeError("the link ended the call without a response")
    return frame
