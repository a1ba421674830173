"""gRPC messages as plain bytes: a pass-through codec, and a reader that refuses big frames early.

fedcore.wire turns every fleet message into bytes and back (with its strict
:func:`~fedcore.wire.protobuf.parse`), so grpclib only moves frames: :class:`RawCodec`
hands bytes through and never parses, unlike grpclib's ProtoCodec.

grpclib has no cap on a received message: its reader takes the 4-byte length
prefix and then buffers that many bytes, acknowledging HTTP/2 flow control as it
goes, so a peer may make it buffer up to 4 GiB. :func:`receive` reads the same
prefix from the HTTP/2 stream and refuses a length over the cap before reading
any of the body; the handler then ends the call with INVALID_ARGUMENT, grpclib
resets the stream and releases the little that flow control let in. It reads
grpclib's ``server.Stream._stream``, a private attribute, because grpclib 0.4
exposes no hook between the prefix and the body; the pinned range (<0.5) and
the tests that send oversized frames guard it.

A frame must also arrive in time: :func:`receive` gives up on one that has not
come whole within its ``timeout`` (a peer that starts a call and stalls would
otherwise hold the call, and its buffers, for ever). The server decodes each frame
with :func:`fedcore.transport.off_loop.decoded`, so that no request holds the event loop
while it is parsed.
"""

from __future__ import annotations

import struct
from typing import Any

import anyio
import grpclib.const
import grpclib.server
from grpclib.encoding.base import CodecBase

from fedcore.errors import DecodeError
from fedcore.wire.rpc import FleetMethod

_PREFIX = struct.Struct(">?I")

ERROR_TRAILER = "fedcore-error"
"""Trailing metadata naming the error class of a NOT_FOUND or UNAUTHENTICATED status."""
RETRY_TRAILER = "fedcore-retry-after"
"""Trailing metadata of a RESOURCE_EXHAUSTED status: the seconds to wait before calling
again (gRPC's own ``grpc-retry-pushback-ms`` is a name grpclib reserves)."""

STREAMING = {
    FleetMethod.HEARTBEATS: grpclib.const.Cardinality.STREAM_STREAM,
    FleetMethod.GET_BUNDLE: grpclib.const.Cardinality.UNARY_STREAM,
    FleetMethod.PULL_PAYLOAD: grpclib.const.Cardinality.UNARY_STREAM,
    FleetMethod.PUSH_PAYLOAD: grpclib.const.Cardinality.STREAM_UNARY,
}
"""The fleet methods that stream; the others are unary."""


def cardinality(method: FleetMethod) -> grpclib.const.Cardinality:
    return STREAMING.get(method, grpclib.const.Cardinality.UNARY_UNARY)


class RawCodec(CodecBase):
    """Frames are bytes already: send them as they are, receive them as they came.

    Its content subtype is ``proto``, so that gRPC peers with generated protobuf
    code talk to fedcore unchanged.
    """

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, bytes):
            raise TypeError(f"a frame must be bytes, got {type(message).__name__}")
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


async def receive(
    stream: grpclib.server.Stream[bytes, bytes], cap: int, timeout: float | None = None
) -> bytes | None:
    """The next request frame, or None at the end of the stream; raise DecodeError if bad.

    A length over ``cap`` is refused before its body is read; so are compressed
    frames (fedcore never sends them), a stream that ends inside a frame, and a
    frame not whole within ``timeout`` seconds.
    """
    with anyio.move_on_after(timeout):
        return await _receive(stream, cap)
    raise DecodeError(f"the request frame did not arrive within {timeout} s")


async def _receive(stream: grpclib.server.Stream[bytes, bytes], cap: int) -> bytes | None:
    h2_stream = stream._stream
    try:
        prefix = await h2_stream.recv_data(_PREFIX.size)
        if not prefix:
            return None
        if len(prefix) != _PREFIX.size:
            raise DecodeError("the stream ended inside a frame's length prefix")
        compressed, length = _PREFIX.unpack(prefix)
        if compressed:
            raise DecodeError("compressed frames are not accepted")
        if length > cap:
            raise DecodeError(f"a frame of {length} bytes is over the frame cap of {cap}")
        frame = await h2_stream.recv_data(length)
    except AssertionError as exc:  # grpclib's buffer: "Received less data than expected"
        raise DecodeError("the stream ended inside a frame") from exc
    if len(frame) != length:
        raise DecodeError("the stream ended inside a frame")
    return frame
