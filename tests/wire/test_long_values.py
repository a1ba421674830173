"""Long str and bytes values travel after the header, bounded by ``max_value_len``.

A model serialized into a ConfigRecord (CatBoost's JSON, an XGBoost booster) is the
case: megabytes in one value, which msgpack's header caps at 1 MiB and would copy
through its growing buffer. Out of band it is copied once on each side, and a hostile
peer still cannot make the decoder allocate much more than it sent.
"""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest

from fedcore.domain.records import ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import DecodeError, ValueOverCapError, ValueTooLargeError
from fedcore.wire import (
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MAX_VALUE_LEN,
    DecodeLimits,
    pack_recorddict,
    pack_recorddict_parts,
    unpack_recorddict,
)
from fedcore.wire.records import HEADER_VALUE_MAX, bulk_bytes, check_value_sizes

MiB = 1 << 20


def frame(header: object, *blobs: bytes) -> bytes:
    """A RecordDict payload built by hand, to test the decoder alone."""
    packed = msgpack.packb(header, use_bin_type=True)
    out = b"FCR" + bytes([FORMAT_VERSION]) + len(packed).to_bytes(4, "big") + packed
    for blob in blobs:
        out += bytes(-len(out) % 16) + blob
    return out


def header_of(payload: bytes) -> object:
    return msgpack.unpackb(payload[8 : 8 + int.from_bytes(payload[4:8], "big")])


def mixed_text(nbytes: int) -> str:
    """A str of exactly ``nbytes`` UTF-8 bytes with 1- to 4-byte characters."""
    unit = "aé€😀"  # 1 + 2 + 3 + 4 bytes
    text = unit * (nbytes // 10)
    return text + "z" * (nbytes - len(text.encode()))


def test_the_default_cap_is_flowers_512_mib() -> None:
    assert MAX_VALUE_LEN == DEFAULT_LIMITS.max_value_len == 512 * MiB


def test_three_mib_bytes_and_str_values_round_trip() -> None:
    blob, text = bytes(range(256)) * (3 * MiB // 256), mixed_text(3 * MiB)
    records = RecordDict({"c": ConfigRecord({"blob": blob, "text": text, "small": "s"})})

    decoded = unpack_recorddict(pack_recorddict(records))

    assert decoded == records
    assert type(decoded["c"]["blob"]) is bytes
    assert type(decoded["c"]["text"]) is str


def test_lists_with_a_long_item_round_trip() -> None:
    records = RecordDict(
        {
            "c": ConfigRecord(
                {"blobs": [b"x" * (2 * MiB), b"", b"y"], "texts": ["", mixed_text(MiB + 1)]}
            )
        }
    )

    payload = pack_recorddict(records)

    assert unpack_recorddict(payload) == records
    assert header_of(payload) == [
        ["c", "c", [["blobs", "B", [2 * MiB, 0, 1]], ["texts", "S", [0, MiB + 1]]]]
    ]


def test_values_up_to_the_header_cap_stay_in_the_header_as_before() -> None:
    text = mixed_text(HEADER_VALUE_MAX)
    records = RecordDict({"c": ConfigRecord({"blob": b"b" * HEADER_VALUE_MAX, "text": text})})

    payload = pack_recorddict(records)

    assert header_of(payload) == [["c", "c", [["blob", b"b" * HEADER_VALUE_MAX], ["text", text]]]]
    assert unpack_recorddict(payload) == records


def test_a_long_bytes_value_is_not_copied_to_encode_it() -> None:
    blob = b"m" * (2 * MiB)

    parts = pack_recorddict_parts(RecordDict({"c": ConfigRecord({"model": blob})}))

    assert any(isinstance(part, memoryview) and part.obj is blob for part in parts)


def test_decoding_a_long_value_allocates_it_once() -> None:
    payload = pack_recorddict(RecordDict({"c": ConfigRecord({"model": b"m" * (8 * MiB)})}))
    tracemalloc.start()
    try:
        decoded = unpack_recorddict(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded["c"]["model"] == b"m" * (8 * MiB)
    assert 8 * MiB <= peak < 9 * MiB


def test_a_str_costs_at_most_five_times_the_bytes_that_carried_it() -> None:
    # One astral character makes CPython store every character in 4 bytes, the worst
    # case; its UTF-8 decoder holds one more byte per byte while it works.
    text = "😀" + "a" * (4 * MiB)
    payload = pack_recorddict(RecordDict({"c": ConfigRecord({"t": text})}))
    tracemalloc.start()
    try:
        decoded = unpack_recorddict(payload)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded["c"]["t"] == text
    assert kept <= 4 * len(payload) + 64 * 1024
    assert peak <= 5 * len(payload) + 64 * 1024


def test_a_value_over_the_receivers_cap_is_refused_before_it_is_copied() -> None:
    payload = pack_recorddict(RecordDict({"c": ConfigRecord({"model": b"m" * (3 * MiB)})}))

    with pytest.raises(
        DecodeError, match="value 'model' of 3145728 bytes is over the cap of"
    ) as refused:
        unpack_recorddict(payload, DecodeLimits(max_value_len=2 * MiB))
    assert isinstance(refused.value, ValueOverCapError), "a kind of refusal a node answers"
    assert unpack_recorddict(payload, DecodeLimits(max_value_len=3 * MiB))["c"]["model"]


def test_a_list_counts_its_items_together_against_the_cap() -> None:
    records = RecordDict({"c": ConfigRecord({"parts": [b"a" * (2 * MiB), b"b" * (2 * MiB)]})})

    with pytest.raises(DecodeError, match="4194304 bytes is over the cap"):
        unpack_recorddict(pack_recorddict(records), DecodeLimits(max_value_len=3 * MiB))
    with pytest.raises(ValueTooLargeError, match="'parts'"):
        check_value_sizes(records, 3 * MiB)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (frame([["c", "c", [["k", "b", 5]]]], b"hello"), "travelled after the header, but fits"),
        (frame([["c", "c", [["k", "x", MiB + 1]]]]), "unknown kind 'x'"),
        (frame([["c", "c", [["k", "b", -1]]]]), "must be non-negative ints"),
        (frame([["c", "c", [["k", "b", "2"]]]]), "must be non-negative ints"),
        (frame([["c", "c", [["k", "B", 5]]]]), "lengths of value 'k' must be a list"),
        (frame([["c", "c", [["k", "b", MiB + 1]]]], b"x" * 10), "past the end of the payload"),
        (frame([["c", "c", [["k", "s", MiB + 1]]]], b"\xff" * (MiB + 1)), "not valid UTF-8"),
        (frame([["m", "m", [["k", "b", MiB + 1]]]], b"x" * (MiB + 1)), "must be int or float"),
        (frame([["c", "c", [["k", "b", 2**40]]]]), "over the cap of 536870912"),
        (frame([["c", "c", [["k", 1], ["k", "b", 2**40]]]]), "duplicate key"),
    ],
)
def test_malformed_long_values_are_named(payload: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        unpack_recorddict(payload)


def test_check_value_sizes_names_the_record_and_key() -> None:
    records = RecordDict({"cfg": ConfigRecord({"model": "x" * 100, "lr": 0.1})})

    check_value_sizes(records, 100)
    with pytest.raises(ValueTooLargeError) as info:
        check_value_sizes(records, 99)
    assert str(info.value) == (
        "config record 'cfg' holds 100 bytes of str in 'model', over the cap of 99 bytes on "
        "one value"
    )


def test_bulk_bytes_counts_arrays_and_long_values() -> None:
    records = RecordDict(
        {"c": ConfigRecord({"b": b"1234", "l": ["ab", "c"], "n": 3}), "m": MetricRecord({"x": 1})}
    )
    assert bulk_bytes(records) == 7
