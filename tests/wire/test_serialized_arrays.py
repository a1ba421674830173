"""A SerializedArray (an Array whose four fields are kept as given) travels as itself.

Flower's legacy strategies may put what numpy.save wrote of strings into Parameters
(e2e-pandas does); fedcore keeps such a tensor as a SerializedArray, and every path a
record takes between processes (the process pool, the runtime API, the fleet,
checkpoints) goes through :mod:`fedcore.wire.records`, so a round trip here is one there.
"""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest

from fedcore.domain.array import Array, SerializedArray
from fedcore.domain.message import Message
from fedcore.domain.records import ArrayRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.wire import (
    DecodeLimits,
    pack_message,
    pack_recorddict,
    unpack_message,
    unpack_recorddict,
)
from fedcore.wire.frame import FORMAT_VERSION


def npy(arr: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, arr, allow_pickle=False)
    return buffer.getvalue()


STRINGS = npy(np.array(["setosa", "virginica"]))
KEPT = {
    "strings": ("", (), "numpy.ndarray", STRINGS),
    "other stype": ("float32", (2, 3), "torch.Tensor", bytes(range(24))),
    "empty": ("", (), "my.format", b""),
}


def fields(array: Array) -> tuple[object, object, object, object]:
    return (array.dtype, array.shape, array.stype, array.data)


def kept_record() -> ArrayRecord:
    record = ArrayRecord({"w": np.arange(6, dtype="<f4").reshape(2, 3)})
    for key, given in KEPT.items():
        record[key] = Array(*given)
    return record


def test_a_record_of_serialized_arrays_round_trips_as_the_same_arrays() -> None:
    record = kept_record()
    assert all(isinstance(record[key], SerializedArray) for key in KEPT)

    back = unpack_recorddict(pack_recorddict(RecordDict({"arrays": record})))["arrays"]

    assert isinstance(back, ArrayRecord)
    assert list(back) == ["w", *KEPT]
    np.testing.assert_array_equal(back["w"], record["w"])
    for key, given in KEPT.items():
        assert type(back[key]) is SerializedArray
        assert fields(back[key]) == given
    np.testing.assert_array_equal(back["strings"].numpy(), np.array(["setosa", "virginica"]))


def test_a_message_carries_a_serialized_array() -> None:
    msg = Message(RecordDict({"fitins.parameters": kept_record()}), 7, "train", ttl=60)
    msg.metadata.run_id, msg.metadata.message_id, msg.metadata.src_node_id = 3, "m-1", 1
    back = unpack_message(pack_message(msg))
    record = back.content.array_records["fitins.parameters"]
    assert {key: fields(record[key]) for key in KEPT} == KEPT


def frame(header: object, *blobs: bytes) -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    out = b"FCR" + bytes([FORMAT_VERSION]) + len(packed).to_bytes(4, "big") + packed
    for blob in blobs:
        out += bytes(-len(out) % 16) + blob
    return out


def kept_payload(dtype: object, shape: object, nbytes: object, stype: object, blob: bytes) -> bytes:
    return frame([["r", "a", [["w", dtype, shape, nbytes, stype]]]], blob)


def test_a_hand_built_serialized_entry_decodes_unread() -> None:
    # Data that is not numpy.save output at all, under "numpy.ndarray": kept, not read.
    record = unpack_recorddict(kept_payload("int8", [-1, 5], 3, "numpy.ndarray", b"abc"))["r"]
    assert isinstance(record, ArrayRecord)
    assert fields(record["w"]) == ("int8", (-1, 5), "numpy.ndarray", b"abc")


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (kept_payload("", [], 4, 7, bytes(4)), "must have a str dtype and stype"),
        (kept_payload(None, [], 4, "x", bytes(4)), "must have a str dtype and stype"),
        (kept_payload("", "1", 4, "x", bytes(4)), "shape of array 'w' must be a list"),
        (kept_payload("", [1.0], 4, "x", bytes(4)), "dimensions must be ints"),
        (kept_payload("", [True], 4, "x", bytes(4)), "dimensions must be ints"),
        (kept_payload("", [1] * 33, 4, "x", bytes(4)), "33 dimensions, more than 32"),
        (kept_payload("", [], -1, "x", b""), "non-negative int"),
        (kept_payload("", [], "4", "x", bytes(4)), "non-negative int"),
        (kept_payload("", [], 2**62, "x", b""), "past the end of the payload"),
        (kept_payload("", [], 8, "x", bytes(4)), "past the end of the payload"),
        (kept_payload("", [], 4, "x", bytes(4)) + b"\0", "1 unexpected bytes"),
        (frame([["r", "a", [[1, "", [], 0, "x"]]]]), "array key must be a str"),
    ],
)
def test_a_bad_serialized_entry_is_named(payload: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        unpack_recorddict(payload)


@pytest.mark.parametrize(
    ("limits", "given", "match"),
    [
        (DecodeLimits(max_str_len=8), ("", (), "a.long.stype", b""), "exceeds max_str_len"),
        (DecodeLimits(max_str_len=8), ("a long dtype", (), "x", b""), "exceeds max_str_len"),
        (DecodeLimits(max_ndim=1), ("", (1, 2), "x", b""), "2 dimensions, more than 1"),
        (DecodeLimits(max_bytes=64), ("", (), "x", bytes(64)), "more than the limit of 64"),
    ],
)
def test_the_decode_limits_bound_a_serialized_entry(
    limits: DecodeLimits, given: tuple[str, tuple[int, ...], str, bytes], match: str
) -> None:
    payload = pack_recorddict(RecordDict({"r": ArrayRecord({"w": Array(*given)})}))
    assert fields(unpack_recorddict(payload)["r"]["w"]) == given  # type: ignore[index]
    with pytest.raises(DecodeError, match=match):
        unpack_recorddict(payload, limits)
