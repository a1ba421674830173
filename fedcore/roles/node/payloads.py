"""A leased message's content that travels as a payload: fetched into one buffer, decoded as views.

The link leases a message whose content is over the inline limit with a
:class:`~fedcore.wire.fleet.PayloadRef` instead of the content. The node streams the
payload's chunks into one buffer allocated at the announced size (never grown,
never copied again) and decodes it there: the arrays the ClientApp gets are
read-only views of that buffer, so a 200 MB model costs the node 200 MB once.
"""

from __future__ import annotations

from fedcore.domain import Message
from fedcore.errors import DecodeError
from fedcore.transport.fleet import FleetService
from fedcore.wire import DEFAULT_LIMITS, unpack_recorddict
from fedcore.wire.fleet import PayloadRef


async def with_payload(
    fleet: FleetService, node_id: int, message: Message, ref: PayloadRef
) -> Message:
    """``message`` with its content fetched from payload ``ref``.

    Raises :class:`DecodeError` for a payload that is not what ``ref`` announced or
    is over the decoding limits, and whatever the fleet raises.
    """
    size = ref.digest.size
    if size > DEFAULT_LIMITS.max_bytes:
        raise DecodeError(
            f"a payload of {size} bytes is over the cap of {DEFAULT_LIMITS.max_bytes}"
        )
    async with fleet.pull_payload(node_id, ref.payload_id) as transfer:
        if transfer.digest != ref.digest:
            raise DecodeError(f"payload {ref.payload_id!r} is not the one the message announced")
        buffer = bytearray(size)
        offset = 0
        async for chunk in transfer.chunks:
            view = memoryview(chunk).cast("B")
            end = offset + len(view)
            if end > size:
                raise DecodeError(f"payload {ref.payload_id!r} runs past its {size} bytes")
            buffer[offset:end] = view
            offset = end
    if offset != size:
        raise DecodeError(f"payload {ref.payload_id!r} ended after {offset} of {size} bytes")
    return message.with_content(unpack_recorddict(buffer))
