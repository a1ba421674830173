"""A leased message's content that travels as a payload: streamed into place, decoded as views.

The link leases a message whose content is over the inline limit with a
:class:`~fedcore.domain.fleet.PayloadRef` instead of the content. The node streams the
payload's chunks into a :class:`PayloadSink` of the announced size, each at its
offset (never grown, never copied again), and decodes it there: the arrays the
ClientApp gets are read-only views of the sink's memory, so a 200 MB model costs
the node 200 MB once.

Where that memory is, is the composition root's choice, through the
:class:`PayloadStore` it gives the node. :class:`MemoryPayloads` (the default) uses
a buffer of the node's own, which suits a ClientApp run in the node's process. In
deployment the ClientApp runs in another process, so the root gives a store of
shared-memory segments that its runner knows: the payload lands in the very pages
the ClientApp process maps, and the runner names them instead of copying the
content across.

A content is decoded within the node's :class:`~fedcore.wire.DecodeLimits` (its
``--max-value-bytes`` among them), which :func:`with_payload` hands the sink, and
off the node's event loop past a few KiB (:mod:`fedcore.transport.off_loop`).
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from fedcore.domain import Message, RecordDict
from fedcore.domain.fleet import PayloadRef
from fedcore.errors import DecodeError
from fedcore.transport.fleet import Buffer, FleetService, Transfer
from fedcore.transport.off_loop import decoded_from
from fedcore.wire import DEFAULT_LIMITS, DecodeLimits, unpack_recorddict


class PayloadSink(Protocol):
    """Where one payload lands: written piece by piece, then decoded in place, or discarded."""

    def write(self, offset: int, data: Buffer) -> None:
        """Write ``data`` at ``offset``; the node keeps every piece within the size."""
        ...

    def decode(self, limits: DecodeLimits = DEFAULT_LIMITS) -> RecordDict:
        """The content, once every byte is written, decoded within ``limits``; raises
        ``DecodeError`` for a bad one.

        Its arrays may be views of the sink's memory, which lives as long as they do.
        """
        ...

    def discard(self) -> None:
        """Drop what was written: the payload will not be decoded."""
        ...


class PayloadStore(Protocol):
    """Gives the node a sink for each payload it pulls."""

    def payload_sink(self, size: int) -> PayloadSink:
        """A new sink for a payload of ``size`` bytes."""
        ...


class MemoryPayloads:
    """Payloads in the node's own memory: one buffer each, allocated at the payload's size."""

    def payload_sink(self, size: int) -> PayloadSink:
        return _BufferSink(size)


class _BufferSink:
    def __init__(self, size: int) -> None:
        self._buffer = bytearray(size)

    def write(self, offset: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self._buffer[offset : offset + len(view)] = view

    def decode(self, limits: DecodeLimits = DEFAULT_LIMITS) -> RecordDict:
        return unpack_recorddict(self._buffer, limits)

    def discard(self) -> None:
        self._buffer = bytearray()


async def with_payload(
    fleet: FleetService,
    node_id: int,
    message: Message,
    ref: PayloadRef,
    store: PayloadStore,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> Message:
    """``message`` with its content fetched from payload ``ref`` into a sink of ``store``.

    Raises :class:`DecodeError` for a payload that is not what ``ref`` announced or
    is over ``limits``, and whatever the fleet raises. A payload that fails is
    discarded from the store.
    """
    size = ref.digest.size
    if size > limits.max_bytes:
        raise DecodeError(f"a payload of {size} bytes is over the cap of {limits.max_bytes}")
    async with fleet.pull_payload(node_id, ref.payload_id) as transfer:
        if transfer.digest != ref.digest:
            raise DecodeError(f"payload {ref.payload_id!r} is not the one the message announced")
        sink = store.payload_sink(size)
        try:
            await _fill(sink, transfer, ref)
            content = await decoded_from(partial(sink.decode, limits), size)
        except BaseException:
            sink.discard()
            raise
    return message.with_content(content)


async def _fill(sink: PayloadSink, transfer: Transfer, ref: PayloadRef) -> None:
    """Write the transfer's chunks into ``sink`` in order; raise if they miss its size."""
    size = ref.digest.size
    offset = 0
    async for chunk in transfer.chunks:
        view = memoryview(chunk).cast("B")
        end = offset + len(view)
        if end > size:
            raise DecodeError(f"payload {ref.payload_id!r} runs past its {size} bytes")
        sink.write(offset, view)
        offset = end
    if offset != size:
        raise DecodeError(f"payload {ref.payload_id!r} ended after {offset} of {size} bytes")
