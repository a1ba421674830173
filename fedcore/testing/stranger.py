"""What a stranger on the network sends the fleet API: raw frames on a raw gRPC call.

The tests of a link under attack send what no fedcore node would: frames that lie
about their length, bodies that are not protobuf, requests signed by a key the link
has never seen, or not signed at all. :func:`raw_fleet_call` sends exactly the bytes
it is given and reports the status the link ended the call with.
:func:`register_stranger` registers a key that nothing ever uses again (a fake node),
from the loopback address it is told (another peer on the same machine:
``127.0.0.2``, say). :func:`link_name` learns the name a link's signatures must name,
as anyone may.
"""

from __future__ import annotations

import time
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol
from h2.exceptions import StreamClosedError

from fedcore.auth.keys import NodeKey
from fedcore.auth.signatures import LINK, sign
from fedcore.auth.stamps import NO_LINK_YET
from fedcore.transport.grpc.frames import RawCodec, cardinality
from fedcore.wire.rpc import FleetMethod, encode_register_node_request


async def link_name(port: int, host: str = "127.0.0.1", *, source: str | None = None) -> str:
    """The name the link at ``host:port`` goes by now: what its refusal of a call signed
    for no link yet says (a node learns it so), asked from ``source``, if given."""
    method = FleetMethod.HEARTBEAT
    metadata = sign(NodeKey.generate(), method.value, b"", time.time(), link=NO_LINK_YET)
    async with _channel(host, port, source) as channel:
        stream = channel.request(method.value, cardinality(method), bytes, bytes, metadata=metadata)
        try:
            async with stream:
                await stream.send_message(b"", end=True)
                await stream.recv_message()
        except GRPCError as exc:
            trailers = stream.trailing_metadata
            if exc.status is Status.UNAUTHENTICATED and trailers is not None and LINK in trailers:
                return str(trailers[LINK])
            raise
    raise AssertionError("the link admitted a call signed for no link")


async def raw_fleet_call(
    port: int,
    method: FleetMethod,
    data: bytes,
    *,
    end: bool = True,
    signed: bool = True,
    host: str = "127.0.0.1",
    link: str | None = None,
) -> GRPCError | None:
    """Send ``data`` (framed already) on a call of ``method``; the error it ended with.

    None if the link answered OK. ``end``: end the request stream after ``data``.
    ``signed``: by a stranger with a key of its own (any key may register, by
    default), over the bytes after the 5-byte prefix, so that the link gets past the
    signature to the frame; unsigned, the link refuses the call from its headers. A
    call the link ended while the frame was being sent comes back CANCELLED. ``link``:
    the name the signature names (default: the link's own, :func:`link_name`).
    """
    metadata: tuple[tuple[str, str], ...] = ()
    if signed:
        named = link if link is not None else await link_name(port, host)
        metadata = sign(NodeKey.generate(), method.value, data[5:], time.time(), link=named)
    async with Channel(host, port, codec=RawCodec()) as channel:
        stream = channel.request(method.value, cardinality(method), bytes, bytes, metadata=metadata)
        try:
            async with stream:
                await stream.send_request()
                await stream._stream.send_data(data, end_stream=end)
                await stream.recv_initial_metadata()
                while await stream.recv_message() is not None:
                    pass
        except GRPCError as exc:
            return exc
        except (StreamTerminatedError, StreamClosedError):
            return GRPCError(Status.CANCELLED, "the link ended the call while it was sent")
    return None


async def register_stranger(
    port: int,
    heartbeat_interval: float,
    *,
    host: str = "127.0.0.1",
    source: str | None = None,
    link: str | None = None,
) -> GRPCError | None:
    """Register a key of its own, declaring ``heartbeat_interval``, and never call again:
    a fake node. The error the link refused it with, or None if it registered.
    ``link``: the name the signature names (default: the link's own, :func:`link_name`)."""
    request = encode_register_node_request({}, heartbeat_interval)
    method = FleetMethod.REGISTER_NODE
    named = link if link is not None else await link_name(port, host, source=source)
    metadata = sign(NodeKey.generate(), method.value, request, time.time(), link=named)
    async with _channel(host, port, source) as channel:
        stream = channel.request(method.value, cardinality(method), bytes, bytes, metadata=metadata)
        try:
            async with stream:
                await stream.send_message(request, end=True)
                await stream.recv_message()
        except GRPCError as exc:
            return exc
    return None


def _channel(host: str, port: int, source: str | None) -> Channel:
    if source is None:
        return Channel(host, port, codec=RawCodec())
    return _ChannelFrom(source, host, port, codec=RawCodec())


class _ChannelFrom(Channel):
    """grpclib's Channel, connecting from the local address ``source``.

    Overrides grpclib 0.4's private ``_create_connection`` (pinned <0.5), for plain TCP.
    """

    def __init__(self, source: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._source = source

    async def _create_connection(self) -> H2Protocol:
        _, protocol = await self._loop.create_connection(
            self._protocol_factory, self._host, self._port, local_addr=(self._source, 0)
        )
        return protocol
