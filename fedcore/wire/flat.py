"""A fast codec for the fleet messages whose fields are all scalars: :class:`FlatCodec`.

A node heartbeats and pulls all the time, and each of those calls is one small
message of numbers and strings each way. betterproto builds and parses them through
per-attribute hooks (and a ``warnings.catch_warnings`` per default value): 40–80 µs
for a 14-byte heartbeat, a tenth of what the link spends on the whole call. This
codec reads the schema from the generated class once — field numbers, types, which
are repeated — and then encodes from keyword values and decodes into a dict in a
few microseconds.

It writes exactly the bytes betterproto writes (fields in declaration order,
proto3 defaults left out; a test checks that against betterproto for every message
it is used for) and reads exactly what :func:`~fedcore.wire.protobuf.parse` accepts
from untrusted bytes: a field whose wire type is not its schema's, a value out of
its type's range, invalid UTF-8 or a truncated frame is a
:class:`~fedcore.errors.DecodeError`; unknown fields are skipped; the last value of
a singular field wins. Messages with nested messages, maps, oneofs or optional
fields are not flat: the class refuses them, and they stay with betterproto.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, cast

import betterproto

from fedcore.wire.frame import Buffer
from fedcore.wire.protobuf import FRAME_CAP, INT64_MAX, INT64_MIN, UINT64_MAX, invalid

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_DOUBLE = struct.Struct("<d")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1

_WIRE_TYPES = {
    betterproto.TYPE_UINT64: _VARINT,
    betterproto.TYPE_UINT32: _VARINT,
    betterproto.TYPE_SINT64: _VARINT,
    betterproto.TYPE_ENUM: _VARINT,
    betterproto.TYPE_BOOL: _VARINT,
    betterproto.TYPE_DOUBLE: _FIXED64,
    betterproto.TYPE_STRING: _LENGTH_DELIMITED,
    betterproto.TYPE_BYTES: _LENGTH_DELIMITED,
}
_DEFAULTS: dict[str, object] = {
    betterproto.TYPE_UINT64: 0,
    betterproto.TYPE_UINT32: 0,
    betterproto.TYPE_SINT64: 0,
    betterproto.TYPE_ENUM: 0,
    betterproto.TYPE_BOOL: False,
    betterproto.TYPE_DOUBLE: 0.0,
    betterproto.TYPE_STRING: "",
    betterproto.TYPE_BYTES: b"",
}


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    number: int
    proto_type: str
    repeated: bool
    tag: bytes
    """The field's key as written: its number and wire type, as a varint."""


class FlatCodec:
    """Encode and decode one flat generated message type (see the module docstring)."""

    def __init__(self, message_type: type[betterproto.Message]) -> None:
        self.name = message_type.__name__
        proto = cast(Any, message_type)._betterproto  # the pinned betterproto's schema record
        fields = []
        for name, meta in proto.meta_by_field_name.items():
            repeated = proto.default_gen[name] is list
            wire_type = _WIRE_TYPES.get(meta.proto_type)
            if wire_type is None or meta.group or meta.optional:
                raise TypeError(f"{self.name}.{name} is not a plain scalar field")
            if repeated and wire_type != _LENGTH_DELIMITED:
                raise TypeError(f"{self.name}.{name}: packed repeated fields are not supported")
            tag = _varint_bytes(meta.number << 3 | wire_type)
            fields.append(_Field(name, meta.number, meta.proto_type, repeated, tag))
        self._fields = tuple(fields)
        self._by_number = {field.number: field for field in fields}

    def encode(self, **values: Any) -> bytes:
        """The message's bytes; a field not given, or given its default, is left out."""
        unknown = values.keys() - {field.name for field in self._fields}
        if unknown:
            raise TypeError(f"{self.name} has no field {sorted(unknown)[0]!r}")
        out = bytearray()
        for field in self._fields:
            value = values.get(field.name)
            if value is None:
                continue
            for item in value if field.repeated else (value,):
                if field.repeated or item != _DEFAULTS[field.proto_type]:
                    out += field.tag
                    _encode_value(out, field, item)
        return bytes(out)

    def decode(
        self, data: Buffer, *, max_bytes: int = FRAME_CAP, max_fields: int | None = None
    ) -> dict[str, Any]:
        """Every field's value by name (its default when absent); ``DecodeError`` if bad."""
        view = memoryview(data).cast("B")
        end = len(view)
        if end > max_bytes:
            invalid(f"{end} bytes is more than the frame cap of {max_bytes}")
        values: dict[str, Any] = {
            field.name: [] if field.repeated else _DEFAULTS[field.proto_type]
            for field in self._fields
        }
        position, count = 0, 0
        while position < end:
            count += 1
            if max_fields is not None and count > max_fields:
                invalid(f"a {self.name} of more than {max_fields} fields")
            key, position = _varint(view, position, end)
            number, wire_type = key >> 3, key & 7
            field = self._by_number.get(number)
            if field is None:
                position = _skip(view, position, end, wire_type, self.name)
                continue
            if wire_type != _WIRE_TYPES[field.proto_type]:
                invalid(f"{self.name}.{field.name} must be {field.proto_type}")
            value, position = _decode_value(view, position, end, field, self.name)
            if field.repeated:
                values[field.name].append(value)
            else:
                values[field.name] = value
        return values


def _encode_value(out: bytearray, field: _Field, value: Any) -> None:
    kind = field.proto_type
    if kind == betterproto.TYPE_DOUBLE:
        out += _DOUBLE.pack(value)
    elif kind == betterproto.TYPE_STRING:
        encoded = value.encode("utf-8")
        out += _varint_bytes(len(encoded))
        out += encoded
    elif kind == betterproto.TYPE_BYTES:
        out += _varint_bytes(len(value))
        out += value
    elif kind == betterproto.TYPE_SINT64:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{field.name} = {value} does not fit a sint64")
        out += _varint_bytes((value << 1) ^ (value >> 63) if value < 0 else value << 1)
    elif kind == betterproto.TYPE_ENUM:
        out += _varint_bytes(int(value) + 2**64 if value < 0 else int(value))
    elif kind == betterproto.TYPE_UINT32 and not 0 <= value <= _UINT32_MAX:
        raise ValueError(f"{field.name} = {value} does not fit a uint32")
    else:  # uint32, uint64, bool
        out += _varint_bytes(int(value))


def _decode_value(view: memoryview, position: int, end: int, field: _Field, name: str) -> Any:
    kind = field.proto_type
    if kind == betterproto.TYPE_DOUBLE:
        if position + 8 > end:
            invalid(f"{name}.{field.name} is cut short")
        return _DOUBLE.unpack_from(view, position)[0], position + 8
    if kind in (betterproto.TYPE_STRING, betterproto.TYPE_BYTES):
        length, position = _varint(view, position, end)
        if position + length > end:
            invalid(f"{name}.{field.name} is cut short")
        raw = bytes(view[position : position + length])
        if kind == betterproto.TYPE_BYTES:
            return raw, position + length
        try:
            return raw.decode("utf-8"), position + length
        except UnicodeDecodeError as exc:
            invalid(f"{name}.{field.name} is not UTF-8", exc)
    value, position = _varint(view, position, end)
    if kind == betterproto.TYPE_BOOL:
        return value != 0, position
    if kind == betterproto.TYPE_SINT64:
        return (value >> 1) ^ -(value & 1), position
    if kind == betterproto.TYPE_ENUM and value > _INT32_MAX:
        # A negative enum is sent as 64 bits; fedcore's enums have none, and the
        # checked parser refuses one as out of range too.
        invalid(f"{name}.{field.name} = {value} is out of range for enum")
    if kind == betterproto.TYPE_UINT32 and value > _UINT32_MAX:
        invalid(f"{name}.{field.name} = {value} is out of range for uint32")
    return value, position


def _skip(view: memoryview, position: int, end: int, wire_type: int, name: str) -> int:
    """Where an unknown field's value ends."""
    if wire_type == _VARINT:
        return _varint(view, position, end)[1]
    if wire_type == _FIXED64:
        position += 8
    elif wire_type == _FIXED32:
        position += 4
    elif wire_type == _LENGTH_DELIMITED:
        length, position = _varint(view, position, end)
        position += length
    else:
        invalid(f"a {name} with a field of wire type {wire_type}")
    if position > end:
        invalid(f"a {name} cut short")
    return position


def _varint(view: memoryview, position: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while position < end and shift < 70:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > UINT64_MAX:
                invalid("a varint of more than 64 bits")
            return value, position
        shift += 7
    return invalid("a truncated or overlong varint")


def _varint_bytes(value: int) -> bytes:
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{value} does not fit a 64-bit varint")
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
