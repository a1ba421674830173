"""Encoding of a Message: its metadata, then its content or its error.

The header is ``[metadata, content, error]``. ``metadata`` lists the nine
:class:`~fedcore.domain.message.Metadata` fields in the fixed order of
:data:`METADATA_FIELDS`, which is part of the format and does not follow the
dataclass. Exactly one of ``content`` (a RecordDict header, see
:mod:`fedcore.wire.records`) and ``error`` (``[code, reason]``) is nil.

A decoded Message is assembled field by field rather than through ``Message(...)``,
whose arguments describe how a message is *made* (a reply copies its routing from the
original), not what a stored one holds. Every field is checked instead, with the
rules the constructor enforces: ints for ids, str for names, a known message type,
a finite creation time and a positive finite ttl. The encoder applies the same checks
and raises ``TypeError``/``ValueError``, so a bad message fails at the sender.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fedcore.domain.message import Error, Message, Metadata, assemble_message, check_message_type
from fedcore.wire import frame
from fedcore.wire.frame import DEFAULT_LIMITS, BlobReader, DecodeLimits, fail
from fedcore.wire.records import decode_recorddict, encode_recorddict

METADATA_FIELDS: tuple[tuple[str, type], ...] = (
    ("run_id", int),
    ("message_id", str),
    ("src_node_id", int),
    ("dst_node_id", int),
    ("reply_to_message_id", str),
    ("group_id", str),
    ("created_at", float),
    ("ttl", float),
    ("message_type", str),
)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def pack_message(msg: Message) -> bytes:
    """Encode a Message; its arrays are copied once, straight into the result."""
    blobs: list[memoryview] = []
    return frame.encode(frame.MESSAGE, encode_message(msg, blobs), blobs)


def encoded_size(msg: Message) -> int:
    """The length of ``pack_message(msg)`` in bytes, without building the payload.

    Only the msgpack header is encoded; arrays count by their byte size (a
    non-contiguous array is still copied once, as the encoder would).
    """
    blobs: list[memoryview] = []
    header = encode_message(msg, blobs)
    return frame.parts_size(frame.encode_parts(frame.MESSAGE, header, blobs))


def unpack_message(
    data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS
) -> Message:
    """Decode :func:`pack_message` output; arrays are read-only views into ``data``."""
    header, reader = frame.decode(data, frame.MESSAGE, limits)
    msg = decode_message(header, reader, limits)
    reader.finish()
    return msg


def encode_message(msg: Message, blobs: list[memoryview]) -> list[Any]:
    """The header of ``msg``; appends the bytes of its arrays to ``blobs``."""
    if msg.has_content():
        return [encode_metadata(msg.metadata), encode_recorddict(msg.content, blobs), None]
    code, reason = msg.error.code, msg.error.reason
    error = [_encoded("error code", int, code), _encoded("error reason", str, reason)]
    _fits_64_bits("error code", error[0])
    return [encode_metadata(msg.metadata), None, error]


def decode_message(header: object, reader: BlobReader, limits: DecodeLimits) -> Message:
    """Rebuild a Message from its header, taking array data from ``reader``."""
    if not isinstance(header, list) or len(header) != 3:
        fail("a message header must be a list of 3 fields")
    fields, content, error = header
    if (content is None) == (error is None):
        fail("a message carries either content or an error, exactly one")
    metadata = decode_metadata(fields)
    if error is None:
        return assemble_message(metadata, content=decode_recorddict(content, reader, limits))
    if not isinstance(error, list) or len(error) != 2:
        fail("a message error must be a list of 2 fields")
    code = _decoded("error code", int, error[0])
    try:
        _fits_64_bits("error code", code)
    except ValueError as exc:
        fail(str(exc), exc)
    return assemble_message(metadata, error=Error(code, _decoded("error reason", str, error[1])))


def encode_metadata(meta: Metadata) -> list[Any]:
    """The metadata fields in the order of :data:`METADATA_FIELDS`, each checked."""
    fields = []
    for name, kind, rule in _RULES:
        value = getattr(meta, name)
        if type(value) is not kind:
            value = _encoded(name, kind, value)
        if rule is not None:
            rule(name, value)
        fields.append(value)
    return fields


def decode_metadata(fields: object) -> Metadata:
    if not isinstance(fields, list) or len(fields) != len(METADATA_FIELDS):
        fail(f"message metadata must be a list of {len(METADATA_FIELDS)} fields")
    for (name, kind, rule), value in zip(_RULES, fields, strict=True):
        if type(value) is not kind:
            fail(f"message {name} must be {kind.__name__}, got {type(value).__name__}")
        if rule is not None:
            try:
                rule(name, value)
            except ValueError as exc:
                fail(str(exc), exc)
    return Metadata(**dict(zip(_NAMES, fields, strict=True)))


def _encoded(name: str, kind: type, value: Any) -> Any:
    """``value`` as exactly ``kind``: an ``ErrorCode`` becomes its int, an int time a float."""
    if kind is float and type(value) is int:
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"message {name} must be {kind.__name__}, got {type(value).__name__}")
    return value if kind is str else kind(value)


def _decoded(name: str, kind: type, value: object) -> Any:
    if type(value) is not kind:
        fail(f"message {name} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _fits_64_bits(name: str, value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"message {name} = {value} does not fit in 64 bits")


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"message {name} must be finite, got {value!r}")


def _positive_finite(name: str, value: float) -> None:
    if not 0 < value < math.inf:
        raise ValueError(f"message {name} must be a positive finite number, got {value!r}")


def _known_type(name: str, value: str) -> None:
    check_message_type(value)


_FIELD_RULES: dict[str, Callable[[str, Any], None]] = {
    "run_id": _fits_64_bits,
    "src_node_id": _fits_64_bits,
    "dst_node_id": _fits_64_bits,
    "created_at": _finite,
    "ttl": _positive_finite,
    "message_type": _known_type,
}
"""The rules beyond the type: 64-bit ids, sane times, a known message type."""
_RULES = tuple((name, kind, _FIELD_RULES.get(name)) for name, kind in METADATA_FIELDS)
_NAMES = tuple(name for name, _ in METADATA_FIELDS)
