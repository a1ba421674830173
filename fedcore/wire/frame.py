"""The frame around every payload: a fixed prefix, a msgpack header, then raw array data.

Why not put array bytes inside the msgpack document as ``bin`` values? Because msgpack's
unpacker returns every ``bin`` as a new ``bytes`` object, so each array would be copied
on decode; and its packer copies each array into a growing buffer and then again into
the result. A one-gigabyte model would need several gigabytes to cross the wire. With
the data out of band, the encoder copies each array exactly once (one ``bytes.join``)
and the decoder hands out ``np.frombuffer`` views over the received bytes, copying
nothing. Those views keep the whole received buffer alive while any of them lives.

Layout, offsets from the start of the payload::

    0   b"FC"           magic
    2   kind            b"R" a RecordDict, b"M" a Message, b"B" a batch of Messages
                        (see :mod:`fedcore.wire.batch`); b"T", b"O", b"Q", b"S" a
                        worker's task, outcome, outcomes of a batch of tasks, and spec
                        (see :mod:`fedcore.wire.worker`)
    3   version         FORMAT_VERSION; any other version is refused
    4   header length   uint32, big-endian
    8   header          msgpack: all structure and values, and each array's dtype,
                        shape and byte count
    ... array data      the arrays' bytes in header order, each starting at a multiple
                        of ALIGNMENT (zero padding before it); nothing after the last

The alignment makes each array aligned for its dtype when the payload itself starts
16-byte aligned, as CPython ``bytes`` do. Encoding is deterministic, and decoding is
strict (zero padding, no trailing bytes), so equal content always has equal bytes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import msgpack

import fedcore.defaults as defaults
from fedcore.errors import DecodeError

FORMAT_VERSION = 1
ALIGNMENT = 16
MAGIC = b"FC"
RECORDDICT = b"R"
MESSAGE = b"M"
BATCH = b"B"
TASK = b"T"
OUTCOME = b"O"
OUTCOMES = b"Q"
SPEC = b"S"
_KIND_NAMES = {
    RECORDDICT: "a RecordDict",
    MESSAGE: "a Message",
    BATCH: "a message batch",
    TASK: "a worker task",
    OUTCOME: "a worker outcome",
    OUTCOMES: "a batch of worker outcomes",
    SPEC: "a worker spec",
}
_PREFIX_LEN = 8
_MAX_HEADER = 2**32 - 1
MAX_DETAIL = 300
MAX_VALUE_LEN = defaults.MAX_VALUE_LEN
"""Bytes one str or bytes value in a record may take by default: Flower's cap on a
message (gRPC's, as Flower sets it), so what Flower carries, fedcore carries."""
"""Characters of detail an error on the wire (or about a payload) carries at most."""
MAX_OBJECTS = 1 << 18
"""Objects a payload's header may decode to by default (:attr:`DecodeLimits.max_objects`)."""


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on what a decoder accepts, so hostile input cannot exhaust memory.

    ``max_bytes`` is checked before anything is parsed. The others bound the msgpack
    header: ``max_str_len`` the length of any str or bytes value in it (keys included),
    ``max_items`` the length of any list, ``max_ndim`` the dimensions of an array.
    ``max_value_len`` bounds a record's str or bytes value too long for the header,
    which travels after it like an array (:mod:`fedcore.wire.records`): Flower's cap on
    a whole message, 512 MiB, by default. Such a value costs the receiver what the
    sender sent (5 times as much at most for a str), so it counts for no objects.

    ``max_objects`` bounds what the header costs once decoded, counted in objects
    rather than bytes: msgpack spends one byte on an empty list, which costs Python 56
    bytes and a pointer, so a header's bytes say little about its cost (a header of
    empty lists is 64 times its size). Every list counts one for itself and one for
    each item, as it is built (so a nested list counts twice); no decoded object but a
    str or bytes value (bounded by the header's bytes) takes more than 64 bytes, so a
    header costs at most about 64 × ``max_objects`` bytes plus its strings, and its
    decoding stops as soon as that is passed: the default, :data:`MAX_OBJECTS`, is
    16 MiB, a few tenths of a second of CPU, and a few tens of milliseconds to free
    what was built when it is refused. A record of 60,000 metrics (4 objects each), or
    an ArrayRecord of 30,000 arrays (8), fits; a batch of many messages needs more
    (:data:`MAX_RUN_OBJECTS`).
    """

    max_bytes: int = 2**31 - 1
    max_str_len: int = 1 << 20
    max_items: int = 1_000_000
    max_ndim: int = 32
    max_objects: int = MAX_OBJECTS
    max_value_len: int = MAX_VALUE_LEN

    def __post_init__(self) -> None:
        names = ("max_bytes", "max_str_len", "max_items", "max_ndim", "max_objects")
        for name in (*names, "max_value_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"DecodeLimits.{name} must be a non-negative int, got {value!r}")


DEFAULT_LIMITS = DecodeLimits()
MAX_RUN_OBJECTS = 1 << 22
"""Objects a header may decode to between a run's own processes and their link (the
runtime API: a batch holds a header for each of up to thousands of messages, a context
what the ServerApp saved) and in what a process stored itself: about 256 MiB at most,
from a party that is no stranger."""
STORED_LIMITS = DecodeLimits(max_value_len=DEFAULT_LIMITS.max_bytes, max_objects=MAX_RUN_OBJECTS)
"""For what a process reads back of what it stored itself (a LinkState's blobs): every
value in it passed the cap of whoever received it, which an operator may have raised
past the default (``fedcore serve --max-value-bytes``), so no cap on one value but the
payload's own."""


class _OverBudget(Exception):
    """The header decodes to more objects than its limits allow."""


class _CollectorPause:
    """Python's cyclic garbage collector, paused while any header is decoded.

    Building a header's lists counts as allocations, and every so often CPython then
    walks every object the process holds, holding the GIL throughout: 60-110 ms at a
    time while 2^18 lists were built, so a decode in a worker thread still held the
    event loop that long (msgpack's own advice is to pause the collector). A header's
    lists hold no cycles; reference counting frees them whatever the collector does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decoding = 0
        self._was_enabled = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._decoding == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._decoding += 1
        try:
            yield
        finally:
            with self._lock:
                self._decoding -= 1
                if self._decoding == 0 and self._was_enabled:
                    gc.enable()


_collector_paused = _CollectorPause()


def fail(
    problem: str, cause: BaseException | None = None, *, error: type[DecodeError] = DecodeError
) -> NoReturn:
    """Raise the one error every malformed payload gives, in at most a few hundred chars:
    ``error``, a :class:`DecodeError` or one of its kinds.

    Problems quote values from the payload, which may be long; they are cut short.
    """
    if len(problem) > MAX_DETAIL:
        problem = problem[: MAX_DETAIL - 3] + "..."
    raise error(f"invalid payload: {problem}") from cause


Buffer = bytes | bytearray | memoryview
"""Bytes in any of the forms they arrive in (a socket read, a mapping, a slice of either)."""

Parts = list[bytes | memoryview]
"""A payload as pieces to concatenate: what is written to a socket or a shared-memory
segment piece by piece, so the array data is copied once, into its destination."""


def encode_parts(kind: bytes, header: object, blobs: Sequence[memoryview]) -> Parts:
    """Frame a header and the array data it describes, without copying the data."""
    packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > _MAX_HEADER:
        raise ValueError(f"payload header of {len(packed)} bytes is too large to frame")
    parts: Parts = [
        MAGIC + kind + bytes([FORMAT_VERSION]) + len(packed).to_bytes(4, "big"),
        packed,
    ]
    position = _PREFIX_LEN + len(packed)
    for blob in blobs:
        pad = -position % ALIGNMENT
        if pad:
            parts.append(bytes(pad))
        parts.append(blob)
        position += pad + blob.nbytes
    return parts


def encode(kind: bytes, header: object, blobs: Sequence[memoryview]) -> bytes:
    """Frame a header and the array data it describes, copying each blob once."""
    return b"".join(encode_parts(kind, header, blobs))


def parts_size(parts: Parts) -> int:
    """The length of the payload ``parts`` make."""
    return sum(part.nbytes if isinstance(part, memoryview) else len(part) for part in parts)


def slices(parts: Iterable[bytes | bytearray | memoryview], size: int) -> Iterator[memoryview]:
    """Views of ``parts`` at most ``size`` bytes long, in order; nothing is copied."""
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, view.nbytes, size):
            yield view[start : start + size]


class BlobReader:
    """Hands out the array data after the header, in order, checking bounds and padding."""

    __slots__ = ("_position", "_view")

    def __init__(self, view: memoryview, start: int) -> None:
        self._view = view
        self._position = start

    def take(self, nbytes: int, what: str) -> memoryview:
        start = self._position + (-self._position % ALIGNMENT)
        end = start + nbytes
        if end > len(self._view):
            fail(f"{what} ends at byte {end}, past the end of the payload ({len(self._view)})")
        if any(self._view[self._position : start]):
            fail(f"nonzero padding before {what}")
        self._position = end
        return self._view[start:end]

    def finish(self) -> None:
        extra = len(self._view) - self._position
        if extra:
            fail(f"{extra} unexpected bytes after the last array")


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def decode(
    data: bytes | bytearray | memoryview, kind: bytes, limits: DecodeLimits
) -> tuple[Any, BlobReader]:
    """Check the prefix and return the header and a reader of the array data.

    Any fault raises DecodeError. The format has no msgpack maps and no extension
    types, so the header may contain neither.

    Arrays built over a ``bytearray`` or writable memoryview share its memory: the
    decoder marks them read-only, but the caller should not reuse the buffer.
    """
    view = memoryview(data)
    if not view.c_contiguous:
        raise TypeError("data must be a contiguous bytes-like object")
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    size = len(view)
    if size > limits.max_bytes:
        fail(f"{size} bytes is more than the limit of {limits.max_bytes}")
    if size < _PREFIX_LEN or view[:2] != MAGIC:
        fail("not a fedcore payload (bad magic bytes)")
    found = bytes(view[2:3])
    if found != kind:
        name = _KIND_NAMES.get(found)
        if name is None:
            fail(f"unknown payload kind {found!r}")
        fail(f"this is {name} payload, expected {_KIND_NAMES[kind]}")
    if view[3] != FORMAT_VERSION:
        fail(f"unsupported format version {view[3]} (this fedcore reads {FORMAT_VERSION})")
    end = _PREFIX_LEN + int.from_bytes(view[4:8], "big")
    if end > size:
        fail(f"header runs to byte {end}, but the payload has {size}")
    budget = limits.max_objects

    def count_list(items: list[Any]) -> list[Any]:
        nonlocal budget
        budget -= 1 + len(items)
        if budget < 0:
            raise _OverBudget
        return items

    try:
        with _collector_paused():
            header = msgpack.unpackb(
                view[_PREFIX_LEN:end],
                list_hook=count_list,
                raw=False,
                use_list=True,
                strict_map_key=True,
                ext_hook=_refuse_ext,
                max_str_len=limits.max_str_len,
                max_bin_len=limits.max_str_len,
                max_array_len=min(limits.max_items, limits.max_objects),
                max_map_len=0,
                max_ext_len=0,
            )
    except _OverBudget as exc:
        fail(
            f"its header decodes to more than {limits.max_objects} objects, the cap "
            "on one payload (lists count twice)",
            exc,
        )
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        fail(f"bad msgpack header: {str(exc) or type(exc).__name__}", exc)
    return header, BlobReader(view, end)
