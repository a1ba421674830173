"""Untrusted protobuf in: :func:`parse`, which checks every field, and the wire's scalar ranges.

betterproto's parser is lenient: on malformed input it raises whatever its internals
hit, and it does not check wire types against the schema. Every fleet message that
arrives goes through :func:`parse`, so what the rest of fedcore gets is typed as its
class says, and every fault is one :class:`~fedcore.errors.DecodeError`.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn, TypeVar, cast

import betterproto

from fedcore.errors import DecodeError
from fedcore.wire.frame import MAX_DETAIL, Buffer

FRAME_CAP = 8 * 1024 * 1024
"""The largest protobuf message, in bytes, sent or accepted on the fleet API (R7 in
docs/reliability.md)."""

UINT64_MAX = 2**64 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_PB = TypeVar("_PB", bound=betterproto.Message)


def invalid(problem: str, cause: BaseException | None = None) -> NoReturn:
    """Raise the error every malformed fleet message gives, cut to a few hundred chars."""
    if len(problem) > MAX_DETAIL:
        problem = problem[: MAX_DETAIL - 3] + "..."
    raise DecodeError(f"invalid fleet message: {problem}") from cause


def parse(
    message_type: type[_PB],
    data: Buffer,
    *,
    max_bytes: int = FRAME_CAP,
    max_fields: int | None = None,
) -> _PB:
    """Parse one protobuf message of ``message_type``, refusing more than ``max_bytes``.

    With ``max_fields``, the bytes are first scanned (:func:`count_fields`) and a
    message, or any message nested in it, with more fields than that is refused
    before betterproto builds anything: its parser costs tens of microseconds per
    field, so a few hundred KiB of empty repeated entries would hold the caller for
    seconds.

    This is where untrusted bytes enter, and betterproto's parser is lenient in two
    ways handled here. It promises no particular exceptions: on malformed input it
    raises whatever its internals hit (``struct.error``, ``EOFError``, ``KeyError``,
    ``UnicodeDecodeError``, ...), and each becomes a DecodeError. And it does not
    check wire types against the schema, so a field may come back with another type
    than declared (an int for a message, a list for a scalar): every field of the
    result is checked, so what this returns is typed as its class says.
    """
    if len(data) > max_bytes:
        invalid(f"{len(data)} bytes is more than the frame cap of {max_bytes}")
    if max_fields is not None:
        count_fields(message_type, memoryview(data).cast("B"), max_fields)
    try:
        message = message_type().parse(bytes(data))
    except Exception as exc:
        invalid(f"not a valid {message_type.__name__}: {type(exc).__name__}", exc)
    _check_fields(message)
    return message


_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def count_fields(
    message_type: type[betterproto.Message], data: memoryview, max_fields: int
) -> None:
    """Refuse ``data`` if it, or a message nested in it, holds more than ``max_fields`` fields.

    A walk of the wire format that builds nothing: it reads each tag, skips each
    value, and descends only into fields the schema declares as messages. It stops
    at the first message over the cap, so its cost is bounded by the cap, not by
    the size of the frame. Malformed bytes are left for the parser to refuse.
    """
    proto = cast(Any, message_type)._betterproto
    nested: dict[int, type[betterproto.Message]] = {
        meta.number: proto.cls_by_field[name]
        for name, meta in proto.meta_by_field_name.items()
        if meta.proto_type == betterproto.TYPE_MESSAGE
    }
    position, end, fields = 0, len(data), 0
    while position < end:
        fields += 1
        if fields > max_fields:
            invalid(f"a {message_type.__name__} of more than {max_fields} fields")
        tag, position = _varint(data, position)
        wire_type = tag & 7
        if wire_type == _VARINT:
            _, position = _varint(data, position)
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _varint(data, position)
            inner = nested.get(tag >> 3)
            if inner is not None and position + length <= end:
                count_fields(inner, data[position : position + length], max_fields)
            position += length
        else:
            return  # not a wire type fedcore's messages use: the parser refuses it


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while position < len(data) and shift < 70:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return value, len(data)  # truncated: the parser refuses it


_SCALAR_TYPES: dict[str, type] = {
    betterproto.TYPE_STRING: str,
    betterproto.TYPE_BYTES: bytes,
    betterproto.TYPE_BOOL: bool,
    betterproto.TYPE_DOUBLE: float,
    betterproto.TYPE_UINT32: int,
    betterproto.TYPE_UINT64: int,
    betterproto.TYPE_SINT64: int,
    betterproto.TYPE_ENUM: int,
}
_INT_RANGES: dict[str, tuple[int, int]] = {
    betterproto.TYPE_UINT32: (0, 2**32 - 1),
    betterproto.TYPE_UINT64: (0, UINT64_MAX),
    betterproto.TYPE_SINT64: (INT64_MIN, INT64_MAX),
    betterproto.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def _check_fields(message: betterproto.Message) -> None:
    """Check that each field of a parsed message holds what the schema declares."""
    proto = cast(Any, message)._betterproto  # the pinned betterproto's own schema record
    for name, meta in proto.meta_by_field_name.items():
        if meta.group and betterproto.which_one_of(message, meta.group)[0] != name:
            continue  # an unset member of a oneof: reading it raises
        value = getattr(message, name)
        where = f"{type(message).__name__}.{name}"
        if proto.default_gen[name] is list:
            if not isinstance(value, list):
                invalid(f"{where} must be repeated")
            for item in value:
                _check_value(item, meta.proto_type, proto.cls_by_field.get(name), where)
        elif not (value is None and meta.optional):
            _check_value(value, meta.proto_type, proto.cls_by_field.get(name), where)


def _check_value(value: object, proto_type: str, cls: type | None, where: str) -> None:
    if proto_type == betterproto.TYPE_MESSAGE:
        if not isinstance(value, betterproto.Message) or cls is None or not isinstance(value, cls):
            invalid(f"{where} must be a message, got {type(value).__name__}")
        _check_fields(value)
        return
    kind = _SCALAR_TYPES[proto_type]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        invalid(f"{where} must be {proto_type}, got {type(value).__name__}")
    if isinstance(value, int) and proto_type in _INT_RANGES:
        low, high = _INT_RANGES[proto_type]
        if not low <= value <= high:
            invalid(f"{where} = {value} is out of range for {proto_type}")


def int_in(name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int in [low, high] that the wire can carry; else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} = {value} is outside the range the wire carries [{low}, {high}]")
    return int(value)


def decoded_int(name: str, value: object, low: int, high: int) -> int:
    try:
        return int_in(name, value, low, high)
    except (TypeError, ValueError) as exc:
        invalid(str(exc), exc)


def seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)
