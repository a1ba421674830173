"""Encoding of records and RecordDicts into a payload header plus out-of-band array data.

A RecordDict's header is a list of ``[name, tag, entries]``, tagged ``"a"`` (ArrayRecord),
``"m"`` (MetricRecord) or ``"c"`` (ConfigRecord). Entries are lists of pairs rather than
msgpack maps, so key order survives. Metric and config entries are ``[key, value]``:
msgpack already tells int from float from bool and str from bin, carries floats as
float64 (NaN, infinities and -0.0 intact) and ints across the whole 64-bit range the
records allow. Array entries are ``[key, dtype, shape, nbytes]``; the bytes follow the
header (see :mod:`fedcore.wire.frame`). The byte count is redundant with dtype and
shape on purpose: a mismatch is reported as exactly that, not as a shifted array.

Decoding rebuilds records through their public constructors, so every value check the
domain makes applies to received data too; its ``TypeError`` becomes ``DecodeError``.
Only the fixed-size dtypes an ArrayRecord accepts are decoded (``_WIRE_DTYPES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from fedcore.domain.records import (
    ARRAY_KINDS,
    ArrayRecord,
    ConfigRecord,
    MetricRecord,
    NDArray,
    RecordDict,
)
from fedcore.wire import frame
from fedcore.wire.frame import DEFAULT_LIMITS, BlobReader, DecodeLimits, fail

ARRAY, METRIC, CONFIG = "a", "m", "c"
_ValueRecord = TypeVar("_ValueRecord", MetricRecord, ConfigRecord)
_FIXED_SIZE_CODES: tuple[str, ...] = ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")
_FIXED_SIZE_CODES += ("f2", "f4", "f8", "c8", "c16")
_INTP_MAX = int(np.iinfo(np.intp).max)
_WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    dtype.str: dtype
    for dtype in (np.dtype(order + code) for order in "<>" for code in _FIXED_SIZE_CODES)
    if dtype.kind in ARRAY_KINDS
}


def pack_recorddict(records: RecordDict) -> bytes:
    """Encode a RecordDict; arrays are copied once, straight into the result."""
    return b"".join(pack_recorddict_parts(records))


def pack_recorddict_parts(records: RecordDict) -> frame.Parts:
    """Encode a RecordDict as parts to write out; the arrays are not copied."""
    blobs: list[memoryview] = []
    header = encode_recorddict(records, blobs)
    return frame.encode_parts(frame.RECORDDICT, header, blobs)


def unpack_recorddict(
    data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS
) -> RecordDict:
    """Decode :func:`pack_recorddict` output; arrays are read-only views into ``data``."""
    header, reader = frame.decode(data, frame.RECORDDICT, limits)
    records = decode_recorddict(header, reader, limits)
    reader.finish()
    return records


def encode_recorddict(records: RecordDict, blobs: list[memoryview]) -> list[Any]:
    """The header of ``records``; appends the bytes of each array to ``blobs``."""
    header: list[Any] = []
    for name, record in records.items():
        if isinstance(record, ArrayRecord):
            # Each array as its .numpy() reads it: the array stored, or an error for an
            # Array kept in a serialisation fedcore cannot read (SerializedArray).
            entries = [_encode_array(key, record[key].numpy(), blobs) for key in record]
            header.append([name, ARRAY, entries])
        else:
            tag = METRIC if isinstance(record, MetricRecord) else CONFIG
            header.append([name, tag, [[key, value] for key, value in record.items()]])
    return header


def _encode_array(key: str, arr: NDArray, blobs: list[memoryview]) -> list[Any]:
    base = arr if arr.flags.c_contiguous else arr.copy(order="C")
    blob = base.reshape(-1).view(np.uint8).data
    blobs.append(blob)
    return [key, arr.dtype.str, list(arr.shape), blob.nbytes]


def decode_recorddict(header: object, reader: BlobReader, limits: DecodeLimits) -> RecordDict:
    """Rebuild a RecordDict from its header, taking array data from ``reader``."""
    records = RecordDict()
    for item in _items(header, "the record dict"):
        name, tag, entries = _fields(item, 3, "a record")
        _check_key(records, name, "record name")
        if tag == ARRAY:
            records[name] = _decode_arrays(name, entries, reader, limits)
        elif tag == METRIC:
            records[name] = _decode_values(MetricRecord(), name, entries)
        elif tag == CONFIG:
            records[name] = _decode_values(ConfigRecord(), name, entries)
        else:
            fail(f"record {name!r} has unknown kind {tag!r}")
    return records


def _decode_arrays(
    name: str, entries: object, reader: BlobReader, limits: DecodeLimits
) -> ArrayRecord:
    record = ArrayRecord()
    for entry in _items(entries, f"array record {name!r}"):
        key, arr = _decode_array(entry, reader, limits)
        _check_key(record, key, f"key in record {name!r}")
        record[key] = arr
    return record


def _decode_values(record: _ValueRecord, name: str, entries: object) -> _ValueRecord:
    for entry in _items(entries, f"record {name!r}"):
        key, value = _fields(entry, 2, f"an entry of record {name!r}")
        _check_key(record, key, f"key in record {name!r}")
        try:
            record[key] = value
        except TypeError as exc:
            fail(str(exc), exc)
    return record


def _decode_array(entry: object, reader: BlobReader, limits: DecodeLimits) -> tuple[str, NDArray]:
    key, dtype_name, shape, nbytes = _fields(entry, 4, "an array entry")
    if type(key) is not str:
        fail(f"array key must be a str, got {type(key).__name__}")
    dtype = _WIRE_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        fail(f"array {key!r} has dtype {dtype_name!r}; only bool, int, float and complex travel")
    dims = _items(shape, f"the shape of array {key!r}")
    if len(dims) > limits.max_ndim:
        fail(f"array {key!r} has {len(dims)} dimensions, more than {limits.max_ndim}")
    if not all(type(d) is int and 0 <= d <= _INTP_MAX for d in dims):
        fail(f"array {key!r} has shape {dims!r}; dimensions must be ints from 0 to {_INTP_MAX}")
    expected = dtype.itemsize * math.prod(dims)
    if type(nbytes) is not int or nbytes != expected:
        fail(f"array {key!r} has {nbytes!r} bytes, expected {expected}")
    buffer = reader.take(expected, f"array {key!r}")
    try:
        arr = np.frombuffer(buffer, dtype=dtype).reshape(tuple(dims))
    except ValueError as exc:
        fail(f"array {key!r}: {exc}", exc)
    arr.flags.writeable = False
    return key, arr


def _items(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        fail(f"{what} must be a list, got {type(value).__name__}")
    return value


def _fields(value: object, count: int, what: str) -> list[Any]:
    items = _items(value, what)
    if len(items) != count:
        fail(f"{what} must have {count} fields, got {len(items)}")
    return items


def _check_key(record: Mapping[str, Any], key: object, what: str) -> None:
    if type(key) is not str:
        fail(f"{what} must be a str, got {type(key).__name__}")
    if key in record:
        fail(f"duplicate {what} {key!r}")
