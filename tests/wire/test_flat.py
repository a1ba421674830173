"""FlatCodec writes what betterproto writes and reads what the checked parser reads."""

from __future__ import annotations

import math
from typing import Any, cast

import betterproto
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.errors import DecodeError, NodeNotFoundError
from fedcore.wire import rpc
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.flat import FlatCodec
from fedcore.wire.protobuf import parse

FLAT: list[type[betterproto.Message]] = [
    pb.HeartbeatRequest,
    pb.HeartbeatFrame,
    pb.HeartbeatResponse,
    pb.PullMessagesRequest,
    pb.RegisterNodeResponse,
    pb.UnregisterNodeRequest,
    pb.UnregisterNodeResponse,
    pb.PushReplyResponse,
    pb.PayloadRef,
    pb.Metadata,
    pb.Error,
]

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    betterproto.TYPE_UINT64: st.integers(0, 2**64 - 1),
    betterproto.TYPE_UINT32: st.integers(0, 2**32 - 1),
    betterproto.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    betterproto.TYPE_ENUM: st.integers(-(2**31), 2**31 - 1),
    betterproto.TYPE_BOOL: st.booleans(),
    betterproto.TYPE_DOUBLE: st.floats(allow_nan=False),
    betterproto.TYPE_STRING: st.text(max_size=20),
    betterproto.TYPE_BYTES: st.binary(max_size=20),
}


def _fields(message_type: type[betterproto.Message]) -> dict[str, st.SearchStrategy[Any]]:
    proto = cast(Any, message_type)._betterproto
    fields = {}
    for name, meta in proto.meta_by_field_name.items():
        values = _VALUES[meta.proto_type]
        fields[name] = st.lists(values, max_size=4) if proto.default_gen[name] is list else values
    return fields


@st.composite
def _messages(draw: st.DrawFn) -> tuple[type[betterproto.Message], dict[str, Any]]:
    message_type = draw(st.sampled_from(FLAT))
    return message_type, draw(st.fixed_dictionaries({}, optional=_fields(message_type)))


def _parsed(message_type: type[betterproto.Message], data: bytes) -> dict[str, Any] | None:
    """What the checked betterproto parser reads from ``data``, each field; None if refused."""
    try:
        message = parse(message_type, data)
    except DecodeError:
        return None
    proto = cast(Any, message_type)._betterproto
    return {name: getattr(message, name) for name in proto.meta_by_field_name}


@settings(max_examples=300, deadline=None)
@given(_messages())
def test_it_encodes_as_betterproto_does_and_decodes_it_back(
    example: tuple[type[betterproto.Message], dict[str, Any]],
) -> None:
    message_type, values = example
    codec = FlatCodec(message_type)
    expected = bytes(message_type(**values))
    assert codec.encode(**values) == expected
    assert _decoded(codec, expected) == _parsed(message_type, expected)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(FLAT), st.binary(max_size=40))
def test_garbage_is_refused_or_read_as_the_checked_parser_reads_it(
    message_type: type[betterproto.Message], data: bytes
) -> None:
    got = _decoded(FlatCodec(message_type), data)
    expected = _parsed(message_type, data)
    # The codec never reads what the checked parser refuses, nor reads it otherwise.
    # It may refuse more: betterproto reads a truncated unknown field, for one.
    if got is not None:
        assert expected is not None, f"read what the checked parser refuses: {data!r}"
        assert _same(got, expected)


@settings(max_examples=200, deadline=None)
@given(
    _messages(), st.integers(20, 2**29 - 1), st.sampled_from([0, 1, 2, 5]), st.binary(max_size=9)
)
def test_unknown_fields_are_skipped(
    example: tuple[type[betterproto.Message], dict[str, Any]],
    number: int,
    wire_type: int,
    value: bytes,
) -> None:
    message_type, values = example
    unknown = {0: b"\x96\x01", 1: value.ljust(8, b"\0")[:8], 2: bytes([len(value)]) + value}
    unknown[5] = value.ljust(4, b"\0")[:4]
    data = FlatCodec(message_type).encode(**values) + _key(number, wire_type) + unknown[wire_type]
    assert _decoded(FlatCodec(message_type), data) == _parsed(message_type, data)


def _key(number: int, wire_type: int) -> bytes:
    value, out = number << 3 | wire_type, bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _decoded(codec: FlatCodec, data: bytes) -> dict[str, Any] | None:
    try:
        return codec.decode(data)
    except DecodeError:
        return None


def _same(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    return all(
        (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and a != a else a == b
        for a, b in ((got[name], expected[name]) for name in expected)
    )


def test_a_field_of_the_wrong_wire_type_is_refused() -> None:
    codec = FlatCodec(pb.HeartbeatRequest)
    with pytest.raises(DecodeError, match="node_id must be uint64"):
        codec.decode(b"\x0a\x01x")  # node_id, length-delimited
    with pytest.raises(DecodeError, match="cut short"):
        codec.decode(b"\x11\x00\x00")  # heartbeat_interval, 3 of its 8 bytes
    with pytest.raises(DecodeError, match="varint"):
        codec.decode(b"\x08" + b"\xff" * 11)
    with pytest.raises(DecodeError, match="UTF-8"):
        codec.decode(b"\x1a\x01\xff")
    too_many = b"\x10\x80\x80\x80\x80\x10"  # PullMessagesRequest.max_messages = 2**32
    assert _parsed(pb.PullMessagesRequest, too_many) is None
    with pytest.raises(DecodeError, match="out of range for uint32"):
        FlatCodec(pb.PullMessagesRequest).decode(too_many)
    with pytest.raises(DecodeError, match="more than 2 fields"):
        codec.decode(b"\x08\x01" * 3, max_fields=2)


def test_messages_that_are_not_flat_are_left_to_betterproto() -> None:
    for message_type in (pb.ConfigEntry, pb.RegisterNodeRequest, pb.Run, pb.PullMessagesResponse):
        with pytest.raises(TypeError, match="not a plain scalar field"):
            FlatCodec(message_type)


def test_values_the_wire_cannot_carry_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        FlatCodec(pb.HeartbeatRequest).encode(node_id=2**64)
    with pytest.raises(ValueError, match="uint32"):
        FlatCodec(pb.PullMessagesRequest).encode(max_messages=2**32)
    with pytest.raises(TypeError, match="no field 'nodeid'"):
        FlatCodec(pb.HeartbeatRequest).encode(nodeid=1)


def test_a_deleted_node_learns_it_from_its_heartbeat() -> None:
    alive = rpc.encode_heartbeat_response(known=True, released=["m"])
    assert rpc.decode_heartbeat_response(alive, 5) == ["m"]
    unknown = rpc.encode_heartbeat_response(known=False)
    with pytest.raises(NodeNotFoundError, match="node 5"):
        rpc.decode_heartbeat_response(unknown, 5)
    with pytest.raises(DecodeError, match="node status"):
        rpc.decode_heartbeat_response(bytes(pb.HeartbeatResponse()), 5)
