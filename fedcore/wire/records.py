"""Encoding of records and RecordDicts into a payload header plus out-of-band array data.

A RecordDict's header is a list of ``[name, tag, entries]``, tagged ``"a"`` (ArrayRecord),
``"m"`` (MetricRecord) or ``"c"`` (ConfigRecord). Entries are lists of pairs rather than
msgpack maps, so key order survives. Metric and config entries are ``[key, value]``:
msgpack already tells int from float from bool and str from bin, carries floats as
float64 (NaN, infinities and -0.0 intact) and ints across the whole 64-bit range the
records allow. Array entries are ``[key, dtype, shape, nbytes]``; the bytes follow the
header (see :mod:`fedcore.wire.frame`). The byte count is redundant with dtype and
shape on purpose: a mismatch is reported as exactly that, not as a shifted array.
A :class:`~fedcore.domain.array.SerializedArray` (an Array whose fields are kept as
given, such as Flower's legacy tensor of strings) has a fifth field, its ``stype``:
``[key, dtype, shape, nbytes, stype]``, with its ``data`` after the header like an
array's bytes. Its dtype and shape are the strs and ints given, not checked against the
data, but bounded as any header's are (``max_str_len``, ``max_ndim``), and it arrives
as the same SerializedArray, its data never read.

A ``str`` or ``bytes`` value longer than :data:`HEADER_VALUE_MAX` bytes (UTF-8 for a
str; a list counts when one of its items is) travels like an array, after the header:
its entry is ``[key, kind, length]`` — kind ``"b"`` or ``"s"`` and one length, or
``"B"`` or ``"S"`` and a list of them. So a model serialized to bytes in a ConfigRecord
(CatBoost's JSON, XGBoost's booster) is copied once into the payload, not through
msgpack's growing buffer, and is bounded by ``DecodeLimits.max_value_len`` (Flower's
512 MiB by default) rather than the header's 1 MiB per string. Decoding copies it once
out of the payload (a ``bytes`` owns its memory); a str takes at most four times its
UTF-8 length (one astral character makes CPython store every character in 4 bytes),
five while it is decoded, well inside the expansion the header's lists are allowed.
Smaller values stay in the header, as they always were, and a peer that reads only
those still reads them.

Decoding rebuilds records through their public constructors, so every value check the
domain makes applies to received data too; its ``TypeError`` becomes ``DecodeError``.
Only the fixed-size dtypes an ArrayRecord accepts are decoded (``_WIRE_DTYPES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from fedcore.domain.array import ARRAY_KINDS, Array, NDArray, SerializedArray
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import ValueOverCapError, ValueTooLargeError
from fedcore.wire import frame
from fedcore.wire.frame import DEFAULT_LIMITS, BlobReader, DecodeLimits, fail

ARRAY, METRIC, CONFIG = "a", "m", "c"
HEADER_VALUE_MAX = 1 << 20
"""Bytes of a str or bytes value that travels in the header; a longer one goes after it."""
_AFTER_HEADER: dict[type, str] = {bytes: "b", str: "s"}
_AFTER_HEADER_LISTS: dict[type, str] = {bytes: "B", str: "S"}
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
    """The header of ``records``; appends the bytes of each array (and of each long str or
    bytes value) to ``blobs``. The cap on a value is the receiver's to enforce (a sender
    may check first: :func:`check_value_sizes`)."""
    header: list[Any] = []
    for name, record in records.items():
        if isinstance(record, ArrayRecord):
            entries = [_encode_array(key, record[key], blobs) for key in record]
            header.append([name, ARRAY, entries])
        elif isinstance(record, MetricRecord):
            header.append([name, METRIC, [[key, value] for key, value in record.items()]])
        else:
            entries = [_encode_config(key, value, blobs) for key, value in record.items()]
            header.append([name, CONFIG, entries])
    return header


def bulk_bytes(records: RecordDict) -> int:
    """About how many bytes of ``records``' payload follow its header: the arrays', and
    those of str and bytes values (a str counted by characters). What decides whether a
    content is worth sharing between the tasks of a round rather than copied into each."""
    total = sum(record.nbytes for record in records.array_records.values())
    for record in records.config_records.values():
        for value in record.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str | bytes):
                    total += len(item)
    return total


def check_value_sizes(records: RecordDict, max_value_len: int, *, whose: str = "") -> None:
    """Raise :class:`ValueTooLargeError` if a str or bytes value of ``records`` is longer
    than ``max_value_len`` bytes, as the encoder would, without encoding anything else;
    ``whose`` (where the cap is set) ends the error's text when given."""
    try:
        for name, record in records.config_records.items():
            for key, value in record.items():
                _long_items(name, key, value, max_value_len)
    except ValueTooLargeError as exc:
        if not whose:
            raise
        raise ValueTooLargeError(f"{exc} ({whose})") from None


def _long_items(name: str, key: str, value: Any, max_value_len: float) -> list[bytes]:
    """The items of a str or bytes value (or list of them) as bytes, when they may be too
    long for the header; an empty list when they certainly fit, or are not str or bytes.

    A str is encoded only if it could be long: UTF-8 takes at most 4 bytes a character.
    """
    items = value if isinstance(value, list) else [value]
    if not items or not isinstance(items[0], str | bytes):
        return []
    most = sum(len(item) if isinstance(item, bytes) else 4 * len(item) for item in items)
    if most <= min(HEADER_VALUE_MAX, max_value_len):
        return []
    encoded = [item if isinstance(item, bytes) else item.encode() for item in items]
    length = sum(len(item) for item in encoded)
    if length > max_value_len:
        raise ValueTooLargeError(
            f"config record {name!r} holds {length} bytes of {type(items[0]).__name__} in "
            f"{key!r}, over the cap of {max_value_len} bytes on one value"
        )
    return encoded


def _encode_config(key: str, value: Any, blobs: list[memoryview]) -> list[Any]:
    encoded = _long_items("", key, value, math.inf)
    if all(len(item) <= HEADER_VALUE_MAX for item in encoded):
        return [key, value]
    blobs.extend(memoryview(item) for item in encoded)
    lengths = [len(item) for item in encoded]
    if isinstance(value, list):
        return [key, _AFTER_HEADER_LISTS[type(value[0])], lengths]
    return [key, _AFTER_HEADER[type(value)], lengths[0]]


def _encode_array(key: str, item: Array, blobs: list[memoryview]) -> list[Any]:
    if isinstance(item, SerializedArray):
        blobs.append(memoryview(item.data))
        return [key, item.dtype, list(item.shape), len(item.data), item.stype]
    arr = item.numpy()
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
            records[name] = _decode_values(MetricRecord(), name, entries, reader, limits)
        elif tag == CONFIG:
            records[name] = _decode_values(ConfigRecord(), name, entries, reader, limits)
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


def _decode_values(
    record: _ValueRecord, name: str, entries: object, reader: BlobReader, limits: DecodeLimits
) -> _ValueRecord:
    for entry in _items(entries, f"record {name!r}"):
        what = f"an entry of record {name!r}"
        fields = _items(entry, what)
        if len(fields) != 3:  # [key, value], or [key, kind, length] of a long value
            fields = _fields(entry, 2, what)
        key = fields[0]
        _check_key(record, key, f"key in record {name!r}")
        value = fields[1] if len(fields) == 2 else _decode_long_value(fields, reader, limits)
        try:
            record[key] = value
        except TypeError as exc:
            fail(str(exc), exc)
    return record


def _decode_long_value(fields: list[Any], reader: BlobReader, limits: DecodeLimits) -> Any:
    """A str or bytes value (or list of them) that travelled after the header."""
    key, kind, lengths = fields
    listed = kind in _AFTER_HEADER_LISTS.values()
    if not listed and kind not in _AFTER_HEADER.values():
        fail(f"value {key!r} has unknown kind {kind!r}")
    items = _items(lengths, f"the lengths of value {key!r}") if listed else [lengths]
    if not all(type(length) is int and length >= 0 for length in items):
        fail(f"value {key!r} has lengths {lengths!r}; they must be non-negative ints")
    if not any(length > HEADER_VALUE_MAX for length in items):
        fail(f"value {key!r} travelled after the header, but fits in it")
    if sum(items) > limits.max_value_len:
        over = f"value {key!r} of {sum(items)} bytes is over the cap of {limits.max_value_len}"
        fail(over, error=ValueOverCapError)
    text = kind in ("s", "S")
    values = [_long_item(reader.take(length, f"value {key!r}"), text, key) for length in items]
    return values if listed else values[0]


def _long_item(view: memoryview, text: bool, key: object) -> str | bytes:
    if not text:
        return bytes(view)
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError as exc:
        fail(f"value {key!r} is not valid UTF-8: {exc}", exc)


def _decode_array(entry: object, reader: BlobReader, limits: DecodeLimits) -> tuple[str, NDArray]:
    fields = _items(entry, "an array entry")
    if len(fields) == 5:
        return _decode_serialized(fields, reader, limits)
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


def _decode_serialized(
    fields: list[Any], reader: BlobReader, limits: DecodeLimits
) -> tuple[str, SerializedArray]:
    """A SerializedArray's entry: its fields as sent, its data taken as bytes, unread."""
    key, dtype_name, shape, nbytes, stype = fields
    if type(key) is not str:
        fail(f"array key must be a str, got {type(key).__name__}")
    if type(dtype_name) is not str or type(stype) is not str:
        fail(f"serialized array {key!r} must have a str dtype and stype")
    dims = _items(shape, f"the shape of array {key!r}")
    if len(dims) > limits.max_ndim:
        fail(f"array {key!r} has {len(dims)} dimensions, more than {limits.max_ndim}")
    if not all(type(d) is int for d in dims):
        fail(f"array {key!r} has shape {dims!r}; dimensions must be ints")
    if type(nbytes) is not int or nbytes < 0:
        fail(f"serialized array {key!r} has {nbytes!r} bytes; a count must be a non-negative int")
    data = bytes(reader.take(nbytes, f"array {key!r}"))
    # Kept as sent: Array(...) would read numpy.save data, which a receiver need not do.
    return key, SerializedArray._kept(dtype_name, tuple(dims), stype, data)


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
