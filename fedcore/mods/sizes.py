"""``message_size_mod`` and ``arrays_size_mod``: log what a node receives and sends.

Flower 1.42's mods of the same names, for finding out what a model costs on the wire
before optimising it. Both log at INFO on ``fedcore.mods.sizes`` and change nothing:

- ``message_size_mod`` — the incoming message's and the outgoing reply's size in
  bytes, exactly as encoded for the wire (:func:`fedcore.wire.message.encoded_size`);
- ``arrays_size_mod`` — per ArrayRecord of the message and of the reply, its number
  of array elements and of bytes (the arrays' ``nbytes``), and the totals.

They act on every message; an error reply has no content and is logged as 0 bytes of
arrays. :func:`fedcore.mods.message_stats_mod` puts such figures into the reply's
metrics instead, for the server to aggregate.
"""

from __future__ import annotations

import logging

from fedcore.apps.client_app import CallNext
from fedcore.domain import Context, Message
from fedcore.wire.message import encoded_size

log = logging.getLogger(__name__)


def message_size_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Log the encoded size of the message and of its reply, in bytes."""
    kind = msg.metadata.message_type
    log.info("message_size_mod: incoming %s message: %d bytes", kind, encoded_size(msg))
    reply = call_next(msg, context)
    log.info("message_size_mod: outgoing reply: %d bytes", encoded_size(reply))
    return reply


def arrays_size_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Log the elements and bytes of every ArrayRecord of the message and of its reply."""
    _log_arrays("incoming", msg)
    reply = call_next(msg, context)
    _log_arrays("outgoing", reply)
    return reply


def array_sizes(msg: Message) -> dict[str, dict[str, int]]:
    """``{record name: {"elements": n, "bytes": b}}`` for each ArrayRecord of ``msg``."""
    if not msg.has_content():
        return {}
    return {
        name: {
            "elements": sum(int(array.size) for array in record.values()),
            "bytes": sum(int(array.nbytes) for array in record.values()),
        }
        for name, record in msg.content.array_records.items()
    }


def _log_arrays(direction: str, msg: Message) -> None:
    sizes = array_sizes(msg)
    for name, size in sizes.items():
        log.info(
            "arrays_size_mod: %s ArrayRecord %r: %d elements, %d bytes",
            direction,
            name,
            size["elements"],
            size["bytes"],
        )
    log.info(
        "arrays_size_mod: %s arrays in all: %d elements, %d bytes",
        direction,
        sum(size["elements"] for size in sizes.values()),
        sum(size["bytes"] for size in sizes.values()),
    )
