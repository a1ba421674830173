"""A node's heartbeats on one long call: :class:`HeartbeatCall`.

A unary call costs the link half a millisecond of HTTP/2 and gRPC bookkeeping —
three header blocks to encode or decode, a stream opened and closed — whatever it
carries. A heartbeat carries a dozen bytes, and a thousand nodes send one each
second, so a node in a session sends them on one ``Heartbeats`` call instead: a
frame and its answer per beat, each frame MAC'd in the session
(:class:`~fedcore.auth.sessions.FrameSeal`) over its place in the call.

The call holds a grpclib stream open between beats. grpclib wakes the task inside
a send or a receive when the connection fails, not the task that opened the
stream, so any task may beat on it, one at a time. A beat that fails or is
cancelled leaves the call broken — a frame may be out with no answer read, and
answers come in order — and the client closes it and opens another.
"""

from __future__ import annotations

from contextlib import suppress
from typing import NoReturn

import anyio
import grpclib.client
import grpclib.const
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import StreamClosedError

from fedcore.auth.sessions import ClientSession, FrameSeal
from fedcore.auth.stamps import new_stamp
from fedcore.clock import Clock
from fedcore.wire import rpc as wire
from fedcore.wire.rpc import FleetMethod

_Stream = grpclib.client.Stream[bytes, bytes]
_CLOSE_SECONDS = 1.0
"""How long closing a call may take to tell the link (a reset frame) before it gives up."""


class _Closed(Exception):
    """The client closed the call."""


class HeartbeatCall:
    """One ``Heartbeats`` call in ``session``, opened by its first :meth:`beat`."""

    def __init__(
        self, channel: grpclib.client.Channel, session: ClientSession, clock: Clock
    ) -> None:
        self._channel = channel
        self.session = session
        self._clock = clock
        self._seal: FrameSeal | None = None
        self._number = 0
        self.stream: _Stream | None = None
        """The call's grpclib stream, once its first beat began it."""
        self.broken = False
        """A beat failed or was cancelled on it: it is closed, not used again."""

    async def beat(self, request: bytes) -> bytes:
        """Send one heartbeat request on the call (beginning it); the link's answer."""
        if self.broken:
            raise RuntimeError("a broken heartbeats call is closed, not used")
        self.broken = True
        if self.stream is None or self._seal is None:
            frame = self._begin(request)
            assert self.stream is not None
            await self.stream.__aenter__()
        else:
            self._number += 1
            frame = wire.encode_heartbeat_frame(request, self._seal.mac(self._number, request))
        await self.stream.send_message(frame)
        answer = await self.stream.recv_message()
        if answer is None:  # the link ended the call: its status says why
            raise_ended(self.stream)
        self.broken = False
        return answer

    def _begin(self, request: bytes) -> bytes:
        """Make the call's stream, its headers MAC'd in the session over its first
        frame; that frame, carrying ``request``."""
        now = self._clock.now()
        stamp = new_stamp(now)
        self._seal = self.session.seal(stamp[1])
        first = wire.encode_heartbeat_frame(request, self._seal.mac(0, request))
        metadata = self.session.metadata(FleetMethod.HEARTBEATS.value, first, now, stamp)
        self.stream = self._channel.request(
            FleetMethod.HEARTBEATS.value,
            grpclib.const.Cardinality.STREAM_STREAM,
            bytes,
            bytes,
            metadata=metadata,
        )
        return first

    async def close(self) -> None:
        """End the call: reset it on the link (if the connection is still there) and
        release it, whatever happens to the task meanwhile."""
        stream = self.stream
        if stream is None:
            return
        self.broken = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
            # Not sent yet, already reset, or the connection is gone: nothing to tell.
            with suppress(ProtocolError, StreamTerminatedError, StreamClosedError, OSError):
                await stream.cancel()
            # Leave it as a failed call: released, and nothing more read (grpclib would
            # wait for a status the link may never send).
            await stream.__aexit__(_Closed, _Closed(), None)


def raise_ended(stream: _Stream) -> NoReturn:
    """Raise the status with which the link ended a call it stopped answering.

    grpclib gives out the status of a call whose requests stream only once the
    client has ended its side, and the link resets the call once its status is
    out, so the client cannot: the status is read from the trailers grpclib
    received (its private ``Stream._stream`` and status parser, grpclib 0.4 as
    pinned, as :mod:`~fedcore.transport.grpc.client` reads them too).
    """
    trailers = stream._stream.trailers
    if trailers is not None:
        status, message, details = stream._process_grpc_status(dict(trailers))
        stream._raise_for_grpc_status(status, message, details)
    raise GRPCError(grpclib.const.Status.UNKNOWN, "the link ended the heartbeats call")
