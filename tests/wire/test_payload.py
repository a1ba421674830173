"""The wire codec: exact round-trips of records and messages; garbage in, DecodeError out."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain.array import Array
from fedcore.domain.message import Error, ErrorCode, Message, Metadata, mark_delivered
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.wire import (
    FORMAT_VERSION,
    DecodeLimits,
    pack_message,
    pack_recorddict,
    unpack_message,
    unpack_recorddict,
)
from fedcore.wire.message import METADATA_FIELDS

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1
CODES = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
DTYPES = sorted({np.dtype(order + code).str for order in "<>" for code in CODES})
LAYOUTS = ("c", "fortran", "transpose", "strided", "reversed")

# ---------------------------------------------------------------- strategies


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    """Arrays of every sendable dtype, random bytes, and C or non-contiguous layouts."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=4)))
    layout = draw(st.sampled_from(LAYOUTS))
    full = (*shape[:-1], 2 * shape[-1]) if layout == "strided" and shape else shape
    size = math.prod(full)
    if dtype.kind == "b":
        base = np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype)
    else:
        raw = draw(st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize))
        base = np.frombuffer(raw, dtype).copy()
    base = base.reshape(full)
    if layout == "fortran":
        return np.asfortranarray(base)
    if layout == "transpose":
        return base.T
    if layout == "strided" and shape:
        return base[..., ::2]
    if layout == "reversed" and shape:
        return base[::-1]
    return base


ints = st.integers(INT64_MIN, UINT64_MAX)
numbers = ints | st.floats()
keys = st.text(max_size=6)
# A record's list holds one type, as in Flower: all ints or all floats.
metric_values = numbers | st.lists(ints, max_size=4) | st.lists(st.floats(), max_size=4)
config_values: st.SearchStrategy[Any] = (
    st.booleans()
    | numbers
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.lists(ints, max_size=3)
    | st.lists(st.floats(), max_size=3)
    | st.lists(st.booleans(), max_size=3)
    | st.lists(st.text(max_size=4), max_size=3)
    | st.lists(st.binary(max_size=4), max_size=3)
)
array_records = st.dictionaries(keys, arrays(), max_size=3).map(ArrayRecord)
metric_records = st.dictionaries(keys, metric_values, max_size=4).map(MetricRecord)
config_records = st.dictionaries(keys, config_values, max_size=4).map(ConfigRecord)
recorddicts = st.dictionaries(
    keys, array_records | metric_records | config_records, max_size=4
).map(RecordDict)
message_types = st.from_regex(
    r"(train|evaluate|query|system)(\.[A-Za-z_][A-Za-z0-9_]*)?", fullmatch=True
)
ttls = st.floats(min_value=0, exclude_min=True, allow_infinity=False)
times = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """A stamped server message, or a stamped reply to one with content or an error."""
    msg = Message(
        draw(recorddicts),
        draw(ints),
        draw(message_types),
        group_id=draw(st.text(max_size=6)),
        ttl=draw(st.none() | ttls),
    )
    msg.metadata.run_id = draw(ints)
    msg.metadata.message_id = draw(st.text(min_size=1, max_size=8))
    msg.metadata.src_node_id = draw(ints)
    msg.metadata.created_at = draw(times)
    if draw(st.booleans()):
        return msg
    if draw(st.booleans()):
        reply = Message(draw(recorddicts), reply_to=msg, ttl=draw(st.none() | ttls))
    else:
        error = Error(draw(st.sampled_from(ErrorCode) | ints), draw(st.text(max_size=8)))
        reply = Message(error=error, reply_to=msg)
    reply.metadata.message_id = draw(st.text(max_size=8))
    reply.metadata.created_at = draw(times)
    return reply


msgpack_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats() | st.text(max_size=6) | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)

# ---------------------------------------------------------------- helpers


def frame(header: object, *blobs: bytes, kind: bytes = b"R") -> bytes:
    """Build a payload by hand, as the format description says, to test the decoder alone."""
    packed = msgpack.packb(header, use_bin_type=True)
    out = b"FC" + kind + bytes([FORMAT_VERSION]) + len(packed).to_bytes(4, "big") + packed
    for blob in blobs:
        out += bytes(-len(out) % 16) + blob
    return out


def split(payload: bytes) -> tuple[Any, bytes]:
    end = 8 + int.from_bytes(payload[4:8], "big")
    return msgpack.unpackb(payload[8:end]), payload[end:]


def arrays_of(records: RecordDict) -> list[np.ndarray[Any, Any]]:
    return [a for r in records.values() if isinstance(r, ArrayRecord) for a in r.values()]


def check_arrays(decoded: RecordDict, original: RecordDict, payload: bytes) -> None:
    whole = np.frombuffer(payload, np.uint8)
    for got, want in zip(arrays_of(decoded), arrays_of(original), strict=True):
        assert got.dtype.str == want.dtype.str
        assert got.shape == want.shape
        assert not got.flags.writeable
        if got.size:
            assert np.shares_memory(got, whole)


def decodes_or_rejects(unpack: Callable[..., object], data: bytes, **kwargs: Any) -> None:
    """A decoder may accept mutated bytes that still form a valid payload, or say DecodeError."""
    with contextlib.suppress(DecodeError):
        unpack(data, **kwargs)


def rejected(
    unpack: Callable[..., object], data: bytes, match: str | None, **kwargs: Any
) -> DecodeError:
    with pytest.raises(DecodeError, match=match) as info:
        unpack(data, **kwargs)
    assert str(info.value).startswith("invalid payload: ")
    return info.value


def sample_records() -> RecordDict:
    return RecordDict(
        {
            "params": ArrayRecord({"w": np.arange(6, dtype="<f4").reshape(2, 3)}),
            "metrics": MetricRecord({"loss": 0.5, "n": 3}),
            "config": ConfigRecord({"lr": 0.1, "name": "x"}),
        }
    )


def sample_message() -> Message:
    msg = Message(sample_records(), 7, "train.fast", group_id="round-1", ttl=60)
    msg.metadata.run_id, msg.metadata.message_id = 3, "m-1"
    msg.metadata.src_node_id, msg.metadata.created_at = 1, 1_700_000_000.25
    return msg


# ---------------------------------------------------------------- round-trips


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recorddicts)
def test_recorddict_round_trip(records: RecordDict) -> None:
    payload = pack_recorddict(records)
    decoded = unpack_recorddict(payload)
    assert decoded == records
    assert [type(r) for r in decoded.values()] == [type(r) for r in records.values()]
    check_arrays(decoded, records, payload)
    assert pack_recorddict(decoded) == payload


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_message_round_trip(msg: Message) -> None:
    payload = pack_message(msg)
    decoded = unpack_message(payload)
    assert decoded == msg
    assert decoded.metadata == msg.metadata
    assert decoded.has_error() == msg.has_error()
    if msg.has_content():
        check_arrays(decoded.content, msg.content, payload)
    assert pack_message(decoded) == payload


def as_flower_arrays(records: RecordDict) -> RecordDict:
    """``records`` rebuilt from Array items, as Flower code builds them (Array(...),
    ArrayRecord.from_array_dict)."""
    rebuilt = RecordDict()
    for name, record in records.items():
        if isinstance(record, ArrayRecord):
            rebuilt[name] = ArrayRecord.from_array_dict({k: Array(a) for k, a in record.items()})
        else:
            rebuilt[name] = record
    return rebuilt


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recorddicts)
def test_arrays_built_the_flower_way_travel_as_plain_arrays_bit_for_bit(
    records: RecordDict,
) -> None:
    flowery = as_flower_arrays(records)
    payload = pack_recorddict(flowery)
    assert payload == pack_recorddict(records)
    decoded = unpack_recorddict(payload)
    assert decoded == records
    for got, want in zip(arrays_of(decoded), arrays_of(records), strict=True):
        assert type(got) is Array
        plain = got.numpy()
        assert type(plain) is np.ndarray
        assert plain.dtype.str == want.dtype.str
        assert plain.shape == want.shape
        assert plain.tobytes() == want.tobytes()
    check_arrays(decoded, records, payload)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.floats(0, 4e9))
def test_delivered_at_stays_with_its_receiver(msg: Message, at: float) -> None:
    payload = pack_message(msg)
    mark_delivered(msg, at)
    assert pack_message(msg) == payload
    decoded = unpack_message(payload)
    assert decoded.metadata.delivered_at == ""
    assert decoded == msg


EDGE_ARRAYS = {
    "0-d float": np.array(1.5),
    "0-d big-endian int": np.array(-7, dtype=">i8"),
    "0-d bool": np.array(True),
    "bool": np.array([True, False, True]),
    "float16": np.array([0.5, -np.inf, np.nan], dtype=np.float16),
    "complex64": np.array([1 + 2j, -0.0j], dtype=np.complex64),
    "big-endian complex128": np.array([[1j, 2], [3, 4]], dtype=">c16"),
    "big-endian float32": np.arange(5, dtype=">f4"),
    "uint64 edges": np.array([0, UINT64_MAX], dtype=np.uint64),
    "int64 edges": np.array([INT64_MIN, 2**63 - 1], dtype=">i8"),
    "empty": np.zeros((0,), dtype=np.float64),
    "empty 2-d": np.zeros((3, 0), dtype=">i2"),
    "slice": np.arange(20, dtype=np.int32)[::3],
    "transpose": np.arange(12, dtype=">f8").reshape(3, 4).T,
    "fortran": np.asfortranarray(np.arange(24, dtype=np.uint16).reshape(2, 3, 4)),
    "negative strides": np.arange(10, dtype=np.int8)[::-2],
}


@pytest.mark.parametrize("arr", EDGE_ARRAYS.values(), ids=EDGE_ARRAYS.keys())
def test_edge_case_arrays(arr: np.ndarray[Any, Any]) -> None:
    records = RecordDict({"r": ArrayRecord({"a": arr, "after": np.array([9], dtype="<u2")})})
    payload = pack_recorddict(records)
    decoded = unpack_recorddict(payload)
    assert decoded == records
    check_arrays(decoded, records, payload)
    np.testing.assert_array_equal(decoded.array_records["r"]["a"], arr)


def test_decoded_arrays_are_read_only_views_of_any_input_buffer() -> None:
    payload = pack_recorddict(sample_records())
    for data in (payload, bytearray(payload), memoryview(b"x" + payload)[1:]):
        arr = unpack_recorddict(data).array_records["params"]["w"]
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            arr[0, 0] = 1
        np.testing.assert_array_equal(arr, np.arange(6).reshape(2, 3))


def test_packing_copies_array_data_once_and_unpacking_not_at_all() -> None:
    arr = np.ones(1 << 20, dtype=np.float64)
    records = RecordDict({"r": ArrayRecord({"w": arr})})
    tracemalloc.start()
    try:
        payload = pack_recorddict(records)
        _, pack_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        decoded = unpack_recorddict(payload)
        _, unpack_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pack_peak < 1.1 * arr.nbytes
    assert unpack_peak - before < 0.01 * arr.nbytes
    assert decoded == records


def test_arrays_are_aligned_in_bytes_payloads() -> None:
    records = RecordDict({"r": ArrayRecord([np.ones(n, dtype=">c16") for n in range(1, 6)])})
    assert all(a.flags.aligned for a in arrays_of(unpack_recorddict(pack_recorddict(records))))


def test_metric_and_config_values_keep_their_exact_types() -> None:
    metrics = MetricRecord(
        {
            "nan": math.nan,
            "inf": math.inf,
            "-inf": -math.inf,
            "-0.0": -0.0,
            "one": 1,
            "one.0": 1.0,
            "min": INT64_MIN,
            "max": UINT64_MAX,
            "ints": [1, INT64_MIN, UINT64_MAX],
            "floats": [1.0, math.nan, -0.0],
            "empty": [],
        }
    )
    config = ConfigRecord(
        {
            "true": True,
            "one": 1,
            "float": 1.0,
            "str": "x",
            "bytes": b"x",
            "empty str": "",
            "empty bytes": b"",
            "bools": [True, False],
            "numbers": [1.0, 2.5],
            "strs": ["a"],
            "blobs": [b"a", b""],
            "min": INT64_MIN,
            "max": UINT64_MAX,
        }
    )
    records = RecordDict({"z": config, "a": metrics, "m": MetricRecord(), "c": ConfigRecord()})
    decoded = unpack_recorddict(pack_recorddict(records))
    assert decoded == records
    assert list(decoded) == ["z", "a", "m", "c"]
    got_m, got_c = decoded.metric_records["a"], decoded.config_records["z"]
    assert list(got_m) == list(metrics)
    assert list(got_c) == list(config)
    assert math.copysign(1.0, got_m["-0.0"]) == -1.0  # type: ignore[arg-type]
    for record, original in ((got_m, metrics), (got_c, config)):
        for key, value in original.items():
            assert type(record[key]) is type(value), key
            if isinstance(value, list):
                assert [type(v) for v in record[key]] == [type(v) for v in value]  # type: ignore[union-attr]


def test_empty_recorddict_round_trips() -> None:
    assert unpack_recorddict(pack_recorddict(RecordDict())) == RecordDict()


def test_message_replies_round_trip() -> None:
    original = sample_message()
    content = Message(sample_records(), reply_to=original)
    error = Message(error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=original)
    for msg in (original, content, error):
        decoded = unpack_message(pack_message(msg))
        assert decoded == msg
        assert decoded.is_reply == msg.is_reply
    assert unpack_message(pack_message(error)).error == Error(2, "boom")


def test_metadata_field_list_covers_the_dataclass() -> None:
    # delivered_at alone stays behind: each receiver stamps its own copy.
    sent = {name for name, _ in METADATA_FIELDS}
    assert sent | {"delivered_at"} == {f.name for f in dataclasses.fields(Metadata)}


# ---------------------------------------------------------------- encoder refusals


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("message_id", None, TypeError),
        ("run_id", True, TypeError),
        ("run_id", 2**64, ValueError),
        ("created_at", math.nan, ValueError),
        ("ttl", -1.0, ValueError),
        ("message_type", "", ValueError),
    ],
)
def test_pack_refuses_bad_metadata(field: str, value: object, error: type[Exception]) -> None:
    msg = sample_message()
    setattr(msg.metadata, field, value)
    with pytest.raises(error):
        pack_message(msg)


def test_pack_widens_int_times_to_float() -> None:
    msg = sample_message()
    msg.metadata.created_at = 5
    decoded = unpack_message(pack_message(msg))
    assert type(decoded.metadata.created_at) is float
    assert decoded == msg


def test_decode_limits_must_be_non_negative_ints() -> None:
    with pytest.raises(ValueError, match="max_items"):
        DecodeLimits(max_items=-1)


# ---------------------------------------------------------------- garbage


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_decode_error(data: bytes) -> None:
    decodes_or_rejects(unpack_recorddict, data)
    decodes_or_rejects(unpack_message, data)


@settings(max_examples=300, deadline=None)
@given(msgpack_values, st.sampled_from([b"R", b"M"]), st.binary(max_size=40))
def test_random_headers_never_raise_anything_but_decode_error(
    header: object, kind: bytes, tail: bytes
) -> None:
    data = frame(header, kind=kind) + tail
    decodes_or_rejects(unpack_recorddict, data)
    decodes_or_rejects(unpack_message, data)


def _mutate(tree: Any, data: st.DataObject) -> Any:
    if isinstance(tree, list) and tree and data.draw(st.integers(0, 3)):
        index = data.draw(st.integers(0, len(tree) - 1))
        return [*tree[:index], _mutate(tree[index], data), *tree[index + 1 :]]
    return data.draw(msgpack_values)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_mutated_headers_never_raise_anything_but_decode_error(
    msg: Message, data: st.DataObject
) -> None:
    header, tail = split(pack_message(msg))
    decodes_or_rejects(unpack_message, frame(_mutate(header, data), kind=b"M") + tail)
    if msg.has_content():
        header, tail = split(pack_recorddict(msg.content))
        decodes_or_rejects(unpack_recorddict, frame(_mutate(header, data)) + tail)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_flipped_and_truncated_payloads_never_raise_anything_but_decode_error(
    msg: Message, data: st.DataObject
) -> None:
    payload = bytearray(pack_message(msg))
    cut = data.draw(st.integers(0, len(payload) - 1))
    rejected(unpack_message, bytes(payload[:cut]), None)
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    decodes_or_rejects(unpack_message, bytes(payload))


def test_every_truncation_and_every_byte_flip_of_a_sample() -> None:
    payload = pack_message(sample_message())
    for cut in range(len(payload)):
        rejected(unpack_message, payload[:cut], None)
    for index in range(len(payload)):
        flipped = bytearray(payload)
        flipped[index] ^= 0xFF
        decodes_or_rejects(unpack_message, bytes(flipped))


def test_prefix_errors_are_named() -> None:
    payload = pack_recorddict(sample_records())
    rejected(unpack_recorddict, b"", "bad magic")
    rejected(unpack_recorddict, b"PK\x03\x04" + payload[4:], "bad magic")
    rejected(unpack_recorddict, b"FCX" + payload[3:], "unknown payload kind b'X'")
    rejected(unpack_message, payload, "this is a RecordDict payload, expected a Message")
    rejected(unpack_recorddict, pack_message(sample_message()), "expected a RecordDict")
    for version in (0, 2, 255):
        rejected(
            unpack_recorddict, payload[:3] + bytes([version]) + payload[4:], f"version {version}"
        )
    rejected(unpack_recorddict, payload[:4] + b"\xff\xff\xff\xff" + payload[8:], "header runs")


def test_input_over_max_bytes_is_rejected_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = pack_recorddict(sample_records())

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded an oversized payload")

    monkeypatch.setattr("fedcore.wire.frame.msgpack.unpackb", must_not_run)
    limits = DecodeLimits(max_bytes=len(payload) - 1)
    rejected(unpack_recorddict, payload, "more than the limit", limits=limits)
    rejected(unpack_recorddict, b"\xff" * len(payload), "more than the limit", limits=limits)


def test_non_contiguous_memoryview_is_a_type_error() -> None:
    payload = pack_recorddict(sample_records())
    view = np.frombuffer(payload * 2, np.uint8)[::2].data
    with pytest.raises(TypeError, match="contiguous"):
        unpack_recorddict(view)


def array_payload(dtype: object, shape: object, nbytes: object, blob: bytes) -> bytes:
    return frame([["r", "a", [["w", dtype, shape, nbytes]]]], blob)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (array_payload("<f4", [4], 12, bytes(12)), "array 'w' has 12 bytes, expected 16"),
        (array_payload("<f4", [2, 2], 12, bytes(12)), "has 12 bytes, expected 16"),
        (array_payload("<f4", [4], "16", bytes(16)), "has '16' bytes"),
        (array_payload("|O", [1], 8, bytes(8)), "dtype '|O'"),
        (array_payload("O", [1], 8, bytes(8)), "dtype 'O'"),
        (array_payload("|V8", [1], 8, bytes(8)), "dtype '|V8'"),
        (array_payload("<U4", [1], 16, bytes(16)), "dtype '<U4'"),
        (array_payload("|S4", [1], 4, bytes(4)), "dtype '|S4'"),
        (array_payload("<M8[s]", [1], 8, bytes(8)), "dtype '<M8"),
        (array_payload("f4,i4", [1], 8, bytes(8)), "dtype 'f4,i4'"),
        (array_payload("(2,)f4", [1], 8, bytes(8)), r"dtype '\(2,\)f4'"),
        (array_payload("float32", [1], 4, bytes(4)), "dtype 'float32'"),
        (array_payload("<f16", [1], 16, bytes(16)), "dtype '<f16'"),
        (array_payload(4, [1], 4, bytes(4)), "dtype 4"),
        (array_payload("<f4", [-1], 4, bytes(4)), "dimensions must be ints"),
        (array_payload("<f4", [True], 4, bytes(4)), "dimensions must be ints"),
        (array_payload("<f4", [1.0], 4, bytes(4)), "dimensions must be ints"),
        (array_payload("<f4", [2**64 - 1], 4, bytes(4)), "dimensions must be ints"),
        (array_payload("<f4", "4", 16, bytes(16)), "shape of array 'w' must be a list"),
        (array_payload("<f4", [1] * 33, 4, bytes(4)), "33 dimensions, more than 32"),
        (array_payload("<f4", [2**31, 2**31], 2**64 - 1, b""), "expected 18446744073709551616"),
        (array_payload("<f4", [2**30, 2**30], 2**62, b""), "past the end of the payload"),
        (array_payload("<i8", [0, 2**62, 4], 0, b""), "array 'w': "),
        (array_payload("<f4", [4], 16, bytes(8)), "past the end of the payload"),
        (array_payload("<f4", [1], 4, bytes(4)) + b"\0", "1 unexpected bytes"),
        (frame([["r", "a", [["w", "<f4", [1], 4]]]]) + b"\1" * 20, "nonzero padding"),
        (frame([["r", "a", [[1, "<f4", [1], 4]]]], bytes(4)), "array key must be a str"),
        (frame([["r", "a", [["w", "<f4", [1]]]]]), "must have 4 fields, got 3"),
        (frame([["r", "a", {}]]), "array record 'r' must be a list, got dict"),
        (frame({}), "the record dict must be a list, got dict"),
        (frame({"a": 1}), "exceeds max_map_len"),
        (frame([["r", "x", []]]), "unknown kind 'x'"),
        (frame([["r", "m"]]), "a record must have 3 fields, got 2"),
        (frame([[7, "m", []]]), "record name must be a str, got int"),
        (frame([["r", "m", []], ["r", "c", []]]), "duplicate record name 'r'"),
        (frame([["r", "m", [["k", 1], ["k", 2]]]]), "duplicate key in record 'r' 'k'"),
        (frame([["r", "m", [[b"k", 1]]]]), "key in record 'r' must be a str, got bytes"),
        (frame([["r", "m", [["k", "1"]]]]), r"MetricRecord\['k'\] must be int or float, got str"),
        (frame([["r", "m", [["k", True]]]]), "got bool"),
        (frame([["r", "m", [["k", None]]]]), "got NoneType"),
        (frame([["r", "m", [["k", [1, [2]]]]]]), "got list"),
        (frame([["r", "c", [["k", [1, "a"]]]]]), "mixes"),
        (frame([["r", "m", [["k", [1, 2.5]]]]]), "mixes float and int"),
        (frame([["r", "c", [["k", [[1]]]]]]), "got list"),
        (frame([["r", "c", [["k", None]]]]), "got NoneType"),
        (frame([["r", "c", [["k", 1, 2, 3]]]]), "must have 2 fields, got 4"),
        (frame([["r", "c", [["k", msgpack.ExtType(5, b"x")]]]]), "max_ext_len"),
        (frame([["r", "c", [["k", msgpack.Timestamp(1)]]]]), "max_ext_len"),
        (frame([]) + b"", None),
    ],
)
def test_structural_garbage_is_named(payload: bytes, match: str | None) -> None:
    if match is None:
        assert unpack_recorddict(payload) == RecordDict()
    else:
        rejected(unpack_recorddict, payload, match)


def test_ext_types_are_refused_even_when_empty() -> None:
    packed = b"\xc7\x00\x05"
    data = b"FCR\x01" + len(packed).to_bytes(4, "big") + packed
    rejected(unpack_recorddict, data, "extension type 5 is not allowed")


def test_deeply_nested_lists_are_refused() -> None:
    packed = b"\x91" * 100_000 + b"\xc0"
    rejected(unpack_recorddict, b"FCR\x01" + len(packed).to_bytes(4, "big") + packed, "msgpack")


@pytest.mark.parametrize(
    ("limits", "records", "match"),
    [
        (DecodeLimits(max_str_len=4), ConfigRecord({"k": "hello"}), "exceeds max_str_len"),
        (DecodeLimits(max_str_len=4), ConfigRecord({"k": b"hello"}), "exceeds max_bin_len"),
        (DecodeLimits(max_str_len=4), ConfigRecord({"long key": 1}), "exceeds max_str_len"),
        (DecodeLimits(max_items=3), MetricRecord({"k": [1, 2, 3, 4]}), "exceeds max_array_len"),
        (DecodeLimits(max_ndim=1), ArrayRecord({"k": np.zeros((1, 1))}), "2 dimensions"),
    ],
)
def test_custom_limits(limits: DecodeLimits, records: Any, match: str) -> None:
    payload = pack_recorddict(RecordDict({"r": records}))
    assert unpack_recorddict(payload) == RecordDict({"r": records})
    rejected(unpack_recorddict, payload, match, limits=limits)


def test_long_values_are_cut_short_in_error_messages() -> None:
    error = rejected(unpack_recorddict, array_payload("x" * 10_000, [1], 4, bytes(4)), "dtype")
    assert len(str(error)) < 400


def message_payload(metadata: list[Any], content: object = None, error: object = None) -> bytes:
    return frame([metadata, content, error], kind=b"M")


def good_metadata() -> list[Any]:
    return [3, "m-1", 1, 7, "", "g", 1.5, 60.0, "train"]


def with_field(index: int, value: object) -> list[Any]:
    fields = good_metadata()
    fields[index] = value
    return fields


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (frame({}, kind=b"M"), "message header must be a list of 3 fields"),
        (frame([good_metadata(), []], kind=b"M"), "list of 3 fields"),
        (message_payload(good_metadata()[:8], []), "list of 9 fields"),
        (message_payload(good_metadata()), "either content or an error"),
        (message_payload(good_metadata(), [], [0, ""]), "either content or an error"),
        (message_payload(with_field(0, "3"), []), "run_id must be int, got str"),
        (message_payload(with_field(2, True), []), "src_node_id must be int, got bool"),
        (message_payload(with_field(1, b"m"), []), "message_id must be str, got bytes"),
        (message_payload(with_field(6, 1), []), "created_at must be float, got int"),
        (message_payload(with_field(6, math.nan), []), "created_at must be finite"),
        (message_payload(with_field(7, 0.0), []), "ttl must be a positive finite"),
        (message_payload(with_field(7, math.inf), []), "ttl must be a positive finite"),
        (message_payload(with_field(7, None), []), "ttl must be float, got NoneType"),
        (message_payload(with_field(8, ""), []), "message_type must be"),
        (message_payload(with_field(8, "fit"), []), "message_type must be"),
        (message_payload(good_metadata(), None, [True, ""]), "error code must be int, got bool"),
        (message_payload(good_metadata(), None, [1, b"x"]), "error reason must be str"),
        (message_payload(good_metadata(), None, [1]), "error must be a list of 2 fields"),
        (message_payload(good_metadata(), {}), "the record dict must be a list"),
        (message_payload(good_metadata(), [["r", "q", []]]), "unknown kind 'q'"),
    ],
)
def test_message_garbage_is_named(payload: bytes, match: str) -> None:
    rejected(unpack_message, payload, match)


def test_hand_built_message_payload_decodes() -> None:
    decoded = unpack_message(message_payload(good_metadata(), None, [5, "gone"]))
    assert decoded.error == Error(ErrorCode.NODE_UNAVAILABLE, "gone")
    assert decoded.metadata == Metadata(3, "m-1", 1, 7, "", "g", 1.5, 60.0, "train")
