"""The fleet wire: domain objects survive protobuf exactly; bad bytes and bad chunks say so."""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain import Error, ErrorCode, Message, Run, RunStatus
from fedcore.domain.fleet import Digest, PayloadRef, PushedReply
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import (
    ConflictError,
    DecodeError,
    MessageNotFoundError,
    NodeNotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.wire import fleet, pack_message, pack_recorddict, pack_recorddict_parts
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.chunks import CHUNK_SIZE, ChunkVerifier, PayloadBuffer, iter_chunks
from fedcore.wire.fleet import MAX_INLINE_CONTENT, message_from_pb, message_to_pb
from fedcore.wire.protobuf import FRAME_CAP, parse

UINT64_MAX, INT64_MIN, INT64_MAX = 2**64 - 1, -(2**63), 2**63 - 1
SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- strategies

ids = st.integers(0, UINT64_MAX)
keys = st.text(max_size=5)
numbers = st.integers(INT64_MIN, UINT64_MAX) | st.floats()
# A record's list holds one type, as in Flower: all ints or all floats.
number_lists = st.lists(st.integers(INT64_MIN, UINT64_MAX), max_size=3) | st.lists(
    st.floats(), max_size=3
)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    dtype = np.dtype(draw(st.sampled_from(["<f4", ">f8", "<i8", "u1", "b1", "<c8"])))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    raw = draw(st.binary(min_size=math.prod(shape) * dtype.itemsize, max_size=10_000))
    base = np.frombuffer(raw[: math.prod(shape) * dtype.itemsize], np.uint8).copy()
    if dtype.kind == "b":
        base = base % 2
    return base.view(dtype).reshape(shape)


recorddicts = st.dictionaries(
    keys,
    st.dictionaries(keys, arrays(), max_size=2).map(ArrayRecord)
    | st.dictionaries(keys, numbers | number_lists, max_size=3).map(MetricRecord)
    | st.dictionaries(
        keys, st.booleans() | numbers | st.text(max_size=5) | st.binary(max_size=5)
    ).map(ConfigRecord),
    max_size=3,
)
message_types = st.from_regex(r"(train|evaluate|query|system)(\.[a-z_][a-z0-9_]*)?", fullmatch=True)
ttls = st.floats(min_value=0, exclude_min=True, allow_infinity=False)
# -0.0 + 0.0 is 0.0: protobuf leaves a field equal to its default (0.0) off the wire, so a
# created_at of -0.0 would arrive as 0.0 (the same instant).
times = st.floats(allow_nan=False, allow_infinity=False).map(lambda t: t + 0.0)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """A stamped message from the server, or a reply to one with content or an error."""
    msg = Message(
        RecordDict(draw(recorddicts)),
        draw(ids),
        draw(message_types),
        group_id=draw(st.text(max_size=6)),
        ttl=draw(st.none() | ttls),
    )
    meta = msg.metadata
    meta.run_id, meta.src_node_id, meta.created_at = draw(ids), draw(ids), draw(times)
    meta.message_id = draw(st.text(min_size=1, max_size=8))
    if draw(st.booleans()):
        return msg
    if draw(st.booleans()):
        reply = Message(RecordDict(draw(recorddicts)), reply_to=msg)
    else:
        code = draw(st.sampled_from(ErrorCode) | st.integers(INT64_MIN, INT64_MAX))
        reply = Message(error=Error(code, draw(st.text(max_size=8))), reply_to=msg)
    reply.metadata.message_id = draw(st.text(max_size=8))
    return reply


config_values = (
    st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from([False, 0, 0.0, -0.0, ""])  # each a protobuf default: must still travel
)
configs = st.dictionaries(keys, config_values, max_size=5)
digests = st.builds(Digest, st.integers(0, UINT64_MAX), st.binary(min_size=32, max_size=32))


def typed(config: dict[str, Any]) -> list[tuple[str, type, str]]:
    """A config as comparable items: order, exact type, and value (NaN and -0.0 included)."""
    return [(key, type(value), repr(value)) for key, value in config.items()]


def wire(message: pb.Message) -> pb.Message:
    """Through bytes and back, as over the network."""
    return parse(pb.Message, bytes(message))


def chunks_of(data: bytes, chunk_size: int = CHUNK_SIZE) -> list[pb.Chunk]:
    return list(iter_chunks(data, Digest.of(data), chunk_size=chunk_size))


def sample_message() -> Message:
    content = RecordDict({"w": ArrayRecord({"a": np.arange(4.0)}), "m": MetricRecord({"n": 3})})
    msg = Message(content, 7, "train", group_id="round-1", ttl=60)
    meta = msg.metadata
    meta.run_id, meta.message_id, meta.src_node_id, meta.created_at = 3, "m-1", 1, 1.7e9
    return msg


def sample_reply() -> Message:
    return Message(
        error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=sample_message()
    )


# ---------------------------------------------------------------- messages


@SLOW
@given(messages())
def test_message_round_trip(msg: Message) -> None:
    decoded = message_from_pb(wire(message_to_pb(msg)))
    assert decoded.metadata == msg.metadata
    assert decoded.has_error() == msg.has_error()
    assert pack_message(decoded) == pack_message(msg)


@SLOW
@given(messages(), st.integers(1, 64))
def test_message_round_trip_through_a_payload(msg: Message, chunk_size: int) -> None:
    if msg.has_error():
        return
    parts = pack_recorddict_parts(msg.content)
    digest = Digest.of(parts)
    received = wire(message_to_pb(msg, payload=PayloadRef("p-1", digest)))
    ref = fleet.payload_ref(received)
    assert ref == PayloadRef("p-1", digest)
    buffer = PayloadBuffer(ref.digest)
    for chunk in iter_chunks(parts, digest, chunk_size=chunk_size):
        buffer.add(parse(pb.Chunk, bytes(chunk)))
    payload = buffer.finish()
    decoded = message_from_pb(received, payload=payload)
    assert pack_message(decoded) == pack_message(msg)
    arrays = [a for r in decoded.content.values() if isinstance(r, ArrayRecord) for a in r.values()]
    whole = np.frombuffer(payload, np.uint8)
    assert all(np.shares_memory(a, whole) for a in arrays if a.size)


def test_a_message_carries_its_metadata_as_fields_and_its_records_as_fedcore_bytes() -> None:
    msg = sample_message()
    encoded = message_to_pb(msg)
    assert encoded.metadata == pb.Metadata(
        run_id=3,
        message_id="m-1",
        src_node_id=1,
        dst_node_id=7,
        group_id="round-1",
        created_at=1.7e9,
        ttl=60.0,
        message_type="train",
    )
    assert encoded.content == pack_recorddict(msg.content)
    reply = message_to_pb(sample_reply())
    assert reply.error == pb.Error(code=2, reason="boom")
    assert reply.metadata.reply_to_message_id == "m-1"


def test_content_over_the_inline_limit_must_travel_as_a_payload() -> None:
    just_over = RecordDict({"w": ArrayRecord({"a": np.zeros(MAX_INLINE_CONTENT // 8 + 1)})})
    with pytest.raises(ValueError, match="inline limit"):
        message_to_pb(sample_message().with_content(just_over))
    big = RecordDict({"w": ArrayRecord({"a": np.zeros(CHUNK_SIZE // 8 + 1)})})  # two chunks
    msg = sample_message().with_content(big)
    parts = pack_recorddict_parts(big)
    digest = Digest.of(parts)
    chunks = list(iter_chunks(parts, digest))
    assert len(chunks) == 2
    for chunk in chunks:
        request = pb.PushPayloadRequest(node_id=UINT64_MAX, message_id="m" * 64, chunk=chunk)
        assert len(bytes(request)) <= FRAME_CAP
    buffer = PayloadBuffer(digest)
    for chunk in chunks:
        buffer.add(chunk)
    received = wire(message_to_pb(msg, payload=PayloadRef("p", digest)))
    assert message_from_pb(received, payload=buffer.finish()).content == big


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("run_id", -1, ValueError),
        ("dst_node_id", 2**64, ValueError),
        ("src_node_id", 1.5, TypeError),
        ("ttl", 0.0, ValueError),
        ("message_type", "fit", ValueError),
    ],
)
def test_what_the_wire_cannot_carry_fails_at_the_sender(
    field: str, value: object, error: type[Exception]
) -> None:
    msg = sample_message()
    setattr(msg.metadata, field, value)
    with pytest.raises(error, match=field):
        message_to_pb(msg)


def test_an_error_code_past_64_bits_fails_at_the_sender() -> None:
    reply = sample_reply()
    reply.error = Error(2**63, "x")
    with pytest.raises(ValueError, match="error code"):
        message_to_pb(reply)
    with pytest.raises(ValueError, match="error reply"):
        message_to_pb(sample_reply(), payload=PayloadRef("p", Digest.of(b"")))


def valid_pb() -> pb.Message:
    return message_to_pb(sample_message())


def without_metadata() -> pb.Message:
    return pb.Message(content=valid_pb().content)


def without_body() -> pb.Message:
    return pb.Message(metadata=valid_pb().metadata)


def error_on_a_non_reply() -> pb.Message:
    return pb.Message(metadata=valid_pb().metadata, error=pb.Error(code=2))


def with_metadata(**fields: Any) -> pb.Message:
    message = valid_pb()
    for name, value in fields.items():
        setattr(message.metadata, name, value)
    return message


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (without_metadata, "needs metadata"),
        (without_body, "content, a payload or an error"),
        (error_on_a_non_reply, "only a reply"),
        (lambda: with_metadata(ttl=0.0), "ttl"),
        (lambda: with_metadata(ttl=math.inf), "ttl"),
        (lambda: with_metadata(created_at=math.nan), "created_at"),
        (lambda: with_metadata(message_type="fit"), "message_type"),
        (lambda: pb.Message(metadata=valid_pb().metadata, content=b"garbage"), "magic"),
        (
            lambda: pb.Message(metadata=valid_pb().metadata, payload=pb.PayloadRef(size=1)),
            "payload id",
        ),
        (
            lambda: pb.Message(
                metadata=valid_pb().metadata,
                payload=pb.PayloadRef(payload_id="p", size=1, sha256=b"x" * 31),
            ),
            "32 bytes",
        ),
    ],
)
def test_invalid_messages_are_refused(make: Any, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        message_from_pb(wire(make()))


def test_ids_past_64_bits_in_the_varint_are_refused() -> None:
    # Field 1 (run_id), a 10-byte varint for 2**64: protobuf's encoding allows 70 bits.
    metadata = bytes([0x08]) + bytes([0x80] * 9) + bytes([0x02])
    body = bytes(valid_pb())
    outer = b"\x0a" + bytes([len(metadata)]) + metadata  # field 1 (metadata) again: merged
    with pytest.raises(DecodeError, match="run_id = 18446744073709551616 is out of range"):
        message_from_pb(parse(pb.Message, body + outer))


@pytest.mark.parametrize(
    ("message_type", "data", "match"),
    [
        (pb.Message, b"\x0a\x00\x08\x05", "Message.metadata must be a message, got int"),
        (pb.Metadata, b"\x0a\x01\x05", "Metadata.run_id must be uint64, got list"),
        (pb.Metadata, b"\x10\x05", "Metadata.message_id must be string, got int"),
        (pb.Chunk, b"\x10\x05", "Chunk.data must be bytes, got int"),
        (pb.HeartbeatRequest, b"\x18\x01", "HeartbeatRequest.message_ids must be string"),
        (pb.ConfigEntry, b"\x28\x01", "ConfigEntry.string_value must be string, got int"),
        (pb.Run, b"\x12\x00\x10\x01", "Run.run_config must be a message, got int"),
        (pb.PullMessagesRequest, b"\x10\x80\x80\x80\x80\x10", "max_messages = 4294967296"),
    ],
)
def test_fields_of_another_type_than_declared_are_refused(
    message_type: Any, data: bytes, match: str
) -> None:
    """betterproto's parser does not check wire types against the schema; parse() does."""
    with pytest.raises(DecodeError, match=match):
        parse(message_type, data)


def test_a_payload_message_needs_its_payload_and_only_it() -> None:
    digest = Digest.of(pack_recorddict(sample_message().content))
    referring = wire(message_to_pb(sample_message(), payload=PayloadRef("p", digest)))
    with pytest.raises(ValueError, match="pass payload="):
        message_from_pb(referring)
    with pytest.raises(ValueError, match="bytes, its reference"):
        message_from_pb(referring, payload=b"short")
    with pytest.raises(ValueError, match="no payload reference"):
        message_from_pb(valid_pb(), payload=b"")
    assert fleet.payload_ref(valid_pb()) is None


# ---------------------------------------------------------------- garbage in


PB_TYPES = [
    pb.Message,
    pb.PushReplyRequest,
    pb.PushPayloadRequest,
    pb.PullMessagesResponse,
    pb.Run,
    pb.RegisterNodeRequest,
    pb.HeartbeatResponse,
    pb.PushReplyResponse,
    pb.Chunk,
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PB_TYPES), st.binary(max_size=64))
def test_random_bytes_parse_or_raise_decode_error(message_type: Any, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        parse(message_type, data)


def mutated(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        action = rng.randrange(3)
        if action == 0 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif action == 1 and out:
            del out[rng.randrange(len(out)) :]
        else:
            out.insert(rng.randrange(len(out) + 1), rng.randrange(256))
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_mutated_messages_decode_or_raise_decode_error(rng: random.Random) -> None:
    """Structure-aware garbage: a valid request with a few bytes changed."""
    valid = rng.choice([sample_message(), sample_reply()])
    request = pb.PushReplyRequest(node_id=5, reply=message_to_pb(valid))
    with contextlib.suppress(DecodeError):
        received = parse(pb.PushReplyRequest, mutated(bytes(request), rng))
        if fleet.payload_ref(received.reply) is None:
            message_from_pb(received.reply)


def test_a_frame_over_the_cap_is_refused_before_parsing() -> None:
    with pytest.raises(DecodeError, match="frame cap"):
        parse(pb.Chunk, bytes(FRAME_CAP + 1))
    with pytest.raises(DecodeError, match="frame cap of 10"):
        parse(pb.Chunk, bytes(11), max_bytes=10)


# ---------------------------------------------------------------- runs, configs, nodes


@SLOW
@given(configs)
def test_config_round_trip(config: dict[str, Any]) -> None:
    entries = [parse(pb.ConfigEntry, bytes(entry)) for entry in fleet.config_to_pb(config)]
    assert typed(fleet.config_from_pb(entries)) == typed(config)


@SLOW
@given(
    ids,
    configs,
    st.none() | st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from(RunStatus),
    st.text(max_size=8),
    digests,
)
def test_run_round_trip(
    run_id: int,
    config: dict[str, Any],
    seed: int | None,
    status: RunStatus,
    reason: str,
    bundle: Digest,
) -> None:
    run = Run(run_id, config, status, reason, seed)
    received = parse(pb.Run, bytes(fleet.run_to_pb(run, bundle)))
    got, got_bundle = fleet.run_from_pb(received)
    assert (got.run_id, got.status, got.reason, got.seed) == (run_id, status, reason, seed)
    assert typed(got.run_config) == typed(config)
    assert got_bundle == bundle


def test_run_statuses_have_their_own_numbers() -> None:
    bundle = Digest(0, bytes(32))
    numbers = {fleet.run_to_pb(Run(1, status=s), bundle).status.value for s in RunStatus}
    assert numbers == {1, 2, 3, 4, 5, 6}
    with pytest.raises(DecodeError, match="run status"):
        fleet.run_from_pb(pb.Run(run_id=1, bundle_sha256=bytes(32)))
    short_hash = fleet.run_to_pb(Run(1), bundle)
    short_hash.bundle_sha256 = bytes(31)
    with pytest.raises(DecodeError, match="run bundle"):
        fleet.run_from_pb(parse(pb.Run, bytes(short_hash)))


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"k": [1]}, TypeError, "'k' has a list"),
        ({"k": b"x"}, TypeError, "'k' has a bytes"),
        ({"k": 2**63}, ValueError, "'k'"),
        ({1: 1}, TypeError, "keys must be str"),
    ],
)
def test_configs_the_wire_cannot_carry(config: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        fleet.config_to_pb(config)


def test_received_configs_are_checked() -> None:
    with pytest.raises(DecodeError, match="duplicate config key 'a'"):
        fleet.config_from_pb([pb.ConfigEntry(key="a", int_value=1)] * 2)
    with pytest.raises(DecodeError, match="'a' has no value"):
        fleet.config_from_pb([parse(pb.ConfigEntry, bytes(pb.ConfigEntry(key="a")))])


def test_registration_round_trip_and_checks() -> None:
    config = {"partition-id": 0, "num-partitions": 2, "gpu": False}
    request = parse(pb.RegisterNodeRequest, bytes(fleet.registration_to_pb(config, 1)))
    got_config, interval = fleet.registration_from_pb(request)
    assert typed(got_config) == typed(config)
    assert interval == 1.0
    assert type(interval) is float
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="heartbeat_interval"):
            fleet.registration_to_pb({}, bad)
        with pytest.raises(DecodeError, match="heartbeat_interval"):
            fleet.registration_from_pb(pb.RegisterNodeRequest(heartbeat_interval=bad))


# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_stored_reply_round_trip(duplicate: bool) -> None:
    response = fleet.push_reply_response(PushedReply("r-1", duplicate))
    assert response.outcome == (2 if duplicate else 1)
    received = parse(pb.PushReplyResponse, bytes(response))
    assert fleet.push_reply_result(received) == PushedReply("r-1", duplicate)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (DecodeError("bad content"), 1),
        (NodeNotFoundError("no node 5"), 2),
        (MessageNotFoundError("no message m"), 3),
        (ConflictError("another reply"), 4),
        (ReplyRejectedError("expired"), 5),
        (RunFinishedError("run 3 finished"), 6),
    ],
)
def test_a_rejection_raises_the_same_error_at_the_node(error: Exception, reason: int) -> None:
    response = fleet.push_reply_rejection(error)  # type: ignore[arg-type]
    assert (response.outcome, response.reason, response.reply_id) == (3, reason, "")
    received = parse(pb.PushReplyResponse, bytes(response))
    with pytest.raises(type(error), match=f"the link rejected the reply: {error}") as info:
        fleet.push_reply_result(received)
    assert type(info.value) is type(error)


def test_malformed_push_outcomes() -> None:
    with pytest.raises(TypeError, match="RunNotFoundError"):
        fleet.push_reply_rejection(RunNotFoundError("no run"))
    for response, match in [
        (pb.PushReplyResponse(), "unknown push outcome"),
        (pb.PushReplyResponse(outcome=pb.PushReplyOutcome.STORED), "needs its id"),
        (pb.PushReplyResponse(outcome=pb.PushReplyOutcome.REJECTED), "unknown reason"),
        (parse(pb.PushReplyResponse, b"\x08\x09"), "unknown push outcome"),
    ]:
        with pytest.raises(DecodeError, match=match):
            fleet.push_reply_result(response)
    with pytest.raises(ValueError, match="has an id"):
        fleet.push_reply_response(PushedReply("", False))


# ---------------------------------------------------------------- chunks


@pytest.mark.parametrize(
    ("size", "lengths"),
    [
        (0, [0]),
        (1, [1]),
        (6, [6]),
        (7, [7]),
        (8, [7, 1]),
        (14, [7, 7]),
        (15, [7, 7, 1]),
    ],
)
def test_chunks_at_the_cap_boundaries(size: int, lengths: list[int]) -> None:
    data = bytes(range(size))
    chunks = chunks_of(data, chunk_size=7)
    assert [len(c.data) for c in chunks] == lengths
    assert [c.offset for c in chunks] == [7 * i for i in range(len(lengths))]
    assert b"".join(c.data for c in chunks) == data
    sha = hashlib.sha256(data).digest()
    assert all((c.total_size, c.sha256) == (size, sha) for c in chunks)
    verifier = ChunkVerifier()
    for chunk in chunks:
        verifier.check(chunk)
    assert verifier.finish() == Digest(size, sha)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=6), st.integers(1, 9))
def test_chunks_cross_part_boundaries(parts: list[bytes], chunk_size: int) -> None:
    whole = b"".join(parts)
    views: list[bytes | memoryview] = [memoryview(part) for part in parts]
    chunks = list(iter_chunks(views, Digest.of(views), chunk_size=chunk_size))
    assert b"".join(c.data for c in chunks) == whole
    assert all(len(c.data) == chunk_size for c in chunks[:-1])
    assert 0 < len(chunks[-1].data) <= chunk_size or whole == b""
    assert Digest.of(views) == Digest(len(whole), hashlib.sha256(whole).digest())


def test_chunking_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        chunks_of(b"abc", chunk_size=0)
    with pytest.raises(ValueError, match="digest says 4 bytes, but data has 3"):
        list(iter_chunks(b"abc", Digest.of(b"abcd")))


DATA = bytes(range(256)) * 4  # 1024 bytes: chunks of 100 make 11, the last of 24


def transfer(chunks: list[pb.Chunk], **kwargs: Any) -> bytearray:
    buffer = PayloadBuffer(Digest.of(DATA), **kwargs)
    for chunk in chunks:
        buffer.add(chunk)
    return buffer.finish()


def corrupted(chunks: list[pb.Chunk]) -> list[pb.Chunk]:
    data = bytearray(chunks[3].data)
    data[5] ^= 1
    chunks[3] = pb.Chunk(chunks[3].offset, bytes(data), chunks[3].total_size, chunks[3].sha256)
    return chunks


def claiming(chunks: list[pb.Chunk], **fields: Any) -> list[pb.Chunk]:
    for name, value in fields.items():
        setattr(chunks[2], name, value)
    return chunks


@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        (lambda c: [c[0], c[2], c[1], *c[3:]], "offset 200, expected offset 100"),
        (lambda c: [*c[:5], *c[6:]], "offset 600, expected offset 500"),
        (lambda c: c[:-1], "after 1000 of 1024 bytes"),
        (lambda c: [], "no chunks"),
        (lambda c: [*c[:4], c[3], *c[4:]], "offset 300, expected offset 400"),
        (lambda c: [*c, c[-1]], "offset 1000, expected offset 1024"),
        (corrupted, "SHA-256 does not match"),
        (lambda c: claiming(c, total_size=2048), "another size or hash"),
        (lambda c: claiming(c, sha256=bytes(32)), "another size or hash"),
        (lambda c: claiming(c, sha256=b""), "32 bytes"),
        (lambda c: [*c[:-1], pb.Chunk(1000, bytes(25), 1024, c[0].sha256)], "past 1024"),
        (lambda c: [*c[:2], pb.Chunk(200, b"", 1024, c[0].sha256), *c[2:]], "empty chunk"),
    ],
    ids=[
        "out-of-order",
        "missing",
        "missing-last",
        "none",
        "duplicated",
        "duplicated-last",
        "corrupted",
        "other-size",
        "other-hash",
        "bad-hash",
        "overflow",
        "empty",
    ],
)
def test_tampered_transfers_are_refused(tamper: Any, match: str) -> None:
    chunks = chunks_of(DATA, chunk_size=100)
    assert transfer(chunks) == DATA
    with pytest.raises(DecodeError, match=match):
        transfer(tamper(chunks_of(DATA, chunk_size=100)))


def test_a_transfer_must_be_the_one_expected() -> None:
    other = bytes(1024)
    with pytest.raises(DecodeError, match="expected 1024 bytes with"):
        transfer(chunks_of(other, chunk_size=100))


def test_a_total_over_the_cap_is_refused_before_anything_is_buffered() -> None:
    # A receiver that does not know the size: the first chunk's claim is checked first.
    verifier = ChunkVerifier(max_size=1023)
    with pytest.raises(DecodeError, match="1024 bytes is over the cap of 1023"):
        verifier.check(chunks_of(DATA, chunk_size=100)[0])
    assert verifier.received == 0
    # A receiver that knows it: refused before the buffer is allocated (a terabyte here).
    with pytest.raises(DecodeError, match="over the cap"):
        PayloadBuffer(Digest(2**40, bytes(32)))
    with pytest.raises(DecodeError, match="over the cap"):
        transfer(chunks_of(DATA, chunk_size=100), max_size=1000)
    assert transfer(chunks_of(DATA, chunk_size=100), max_size=1024) == DATA
