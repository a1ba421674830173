"""Message batches: exact round trips, one copy of a shared content, garbage refused cleanly."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain import Error, ErrorCode, Message
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.wire import DecodeLimits, pack_message
from fedcore.wire.batch import batch_prefix, pack_batch, unpack_batch
from fedcore.wire.message import encode_metadata

MiB = 1 << 20

# ---------------------------------------------------------------- building blocks


def stamped(message: Message, message_id: str) -> Message:
    message.metadata.run_id = 9
    message.metadata.message_id = message_id
    message.metadata.created_at = 1.5
    return message


def to_node(node_id: int, content: RecordDict, message_id: str = "") -> Message:
    return stamped(
        Message(content, node_id, "train", group_id="r1", ttl=60), message_id or f"m{node_id}"
    )


def error_reply(to: Message) -> Message:
    return stamped(
        Message(error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=to), "e"
    )


def model(nbytes: int) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.zeros(nbytes // 4, np.float32)})})


def same(a: Message, b: Message) -> bool:
    """Equal in every field and array byte (the encoding is deterministic)."""
    return pack_message(a) == pack_message(b)


def frame(header: object, kind: bytes = b"B", data: bytes = b"") -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    return b"FC" + kind + b"\x01" + len(packed).to_bytes(4, "big") + packed + data


contents = st.builds(
    lambda floats, metrics, text: RecordDict(
        {
            "arrays": ArrayRecord({"w": np.array(floats, np.float64)}),
            "metrics": MetricRecord({"n": metrics}),
            "config": ConfigRecord({"tag": text}),
        }
    ),
    st.lists(st.floats(), max_size=5),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=5),
)


@st.composite
def batches(draw: st.DrawFn) -> list[Message]:
    """Messages drawing their contents from a small pool, so some share one object."""
    pool = draw(st.lists(contents, min_size=1, max_size=4))
    picks = draw(st.lists(st.integers(0, len(pool) - 1) | st.none(), max_size=12))
    batch = []
    for i, pick in enumerate(picks):
        message = to_node(i + 1, pool[pick if pick is not None else 0], f"m{i}")
        batch.append(message if pick is not None else error_reply(message))
    return batch


# ---------------------------------------------------------------- round trips


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_batches_round_trip_and_keep_their_sharing(batch: list[Message]) -> None:
    decoded = unpack_batch(pack_batch(batch))
    assert len(decoded) == len(batch)
    assert all(same(a, b) for a, b in zip(decoded, batch, strict=True))
    with_content = [i for i, message in enumerate(batch) if message.has_content()]
    for i in with_content:
        for j in with_content:
            shared_before = batch[i].content is batch[j].content
            assert (decoded[i].content is decoded[j].content) == shared_before


def test_an_empty_batch_round_trips() -> None:
    assert unpack_batch(pack_batch([])) == []


def test_a_shared_content_is_packed_once() -> None:
    shared = model(MiB)
    batch = [to_node(node_id, shared) for node_id in range(1, 51)]
    packed = pack_batch(batch)
    assert MiB < len(packed) < MiB + 50 * 200
    decoded = unpack_batch(packed)
    assert all(message.content is decoded[0].content for message in decoded)
    assert decoded[0].content["arrays"]["w"].nbytes == MiB


def test_equal_contents_that_are_different_objects_are_packed_apart() -> None:
    batch = [to_node(1, model(MiB)), to_node(2, model(MiB))]
    packed = pack_batch(batch)
    assert len(packed) > 2 * MiB
    decoded = unpack_batch(packed)
    assert decoded[0].content is not decoded[1].content


def test_decoded_arrays_are_read_only_views_of_the_body() -> None:
    body = pack_batch([to_node(1, model(64))])
    array = unpack_batch(body)[0].content["arrays"]["w"]
    assert not array.flags.writeable
    assert array.base is not None


# ---------------------------------------------------------------- splitting


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.integers(0, 4000))
def test_a_prefix_fits_the_cap_and_always_makes_progress(
    batch: list[Message], max_bytes: int
) -> None:
    count = batch_prefix(batch, max_bytes)
    if not batch:
        assert count == 0
        return
    assert 1 <= count <= len(batch)
    if count > 1:
        assert len(pack_batch(batch[:count])) <= max_bytes
    if count < len(batch):
        assert len(pack_batch(batch[: count + 1])) > max_bytes - 200  # not far from full


def test_a_prefix_counts_a_shared_content_once() -> None:
    shared = model(MiB)
    batch = [to_node(node_id, shared) for node_id in range(1, 51)]
    assert batch_prefix(batch, 2 * MiB) == 50
    assert batch_prefix([to_node(1, model(MiB)), to_node(2, model(MiB))], 2 * MiB) == 1


# ---------------------------------------------------------------- garbage


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        unpack_batch(data)


def metadata() -> list[Any]:
    return encode_metadata(to_node(1, RecordDict()).metadata)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ([[], []], None),
        ([[]], "list of 2 fields"),
        ({"a": 1}, "bad msgpack header"),
        ([[], {}], "must be lists"),
        ([[], [[None, 0, None]]], "not one of the batch's"),
        ([[[]], [[None, 1, None]]], "not one of the batch's"),
        ([[[]], [[None, True, None]]], "not one of the batch's"),
        ([[[]], [[metadata(), 0, [2, "x"]]]], "exactly one"),
        ([[[]], []], "no message uses"),
        ([[], [[metadata(), None, None]]], "exactly one"),
        ([[], [[metadata(), 0]]], "list of 3 fields"),
        ([[[["r", "z", []]]], [[metadata(), 0, None]]], "unknown kind"),
    ],
)
def test_structural_garbage_is_named(header: object, match: str | None) -> None:
    if match is None:
        assert unpack_batch(frame(header)) == []
        return
    with pytest.raises(DecodeError, match=match):
        unpack_batch(frame(header))


def test_another_payload_kind_is_refused_by_name() -> None:
    with pytest.raises(DecodeError, match="a Message payload, expected a message batch"):
        unpack_batch(pack_message(to_node(1, RecordDict())))


def test_the_byte_limit_applies_before_decoding() -> None:
    body = pack_batch([to_node(1, model(4096))])
    with pytest.raises(DecodeError, match="more than the limit"):
        unpack_batch(body, DecodeLimits(max_bytes=len(body) - 1))
