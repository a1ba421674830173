"""What the simulation engine and its worker processes say to each other over a pipe.

Every pipe message is one of:

- a **task** (engine → worker): a message with the Context of its node. The
  message's content travels in the task itself, or — when it is large, or shared by
  many messages of a round — in a shared-memory segment that the task names, so
  the worker maps it instead of receiving a copy;
- an **outcome** (worker → engine): the reply and the node's ``Context.state`` after
  the handler ran;
- **outcomes** (a Ray actor → the engine, which sends an actor several tasks per
  call): the outcomes of the first tasks of a batch, in order, each a whole outcome
  payload starting aligned, and the seconds the actor spent running them;
- a **pointer** (either way): ``b"@"`` and the name of a segment holding a task or
  an outcome too large for the pipe;
- a **release** (engine → worker): ``b"-"`` and the name of an outcome segment the
  engine no longer reads, which the worker may write its next outcome into;
- a worker's **hello**: ``b"+"`` when its ClientApp loaded, or ``b"!"`` and a
  one-line reason when it did not;
- before all of that, the worker's **spec** (engine → worker): what to import and
  where to find it, as ``[key, value]`` pairs of strings, ints and lists of strings.

Contexts carry ``node_config`` and ``run_config`` as lists of ``[key, value]``
pairs whose values must be bool, int, float, str or bytes: a Context is checked on
decode like a record.

On the pipe each message is framed as ``multiprocessing.connection`` frames it — a
big-endian signed 4-byte length, or ``-1`` and an unsigned 8-byte length from 2 GiB
up — because a worker, which has nothing else to do, reads and writes its end with a
blocking ``Connection``. The engine's end, on an event loop, frames with
:func:`framed` and splits what it reads with :class:`Deframer`.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedcore.domain import Context, Message, RecordDict
from fedcore.domain.message import assemble_message
from fedcore.wire import frame
from fedcore.wire.frame import ALIGNMENT, DEFAULT_LIMITS, DecodeLimits, Parts, fail, parts_size
from fedcore.wire.message import decode_message, decode_metadata, encode_message, encode_metadata
from fedcore.wire.records import decode_recorddict, encode_recorddict

HELLO = b"+"
FAILED = b"!"
POINTER = b"@"
RELEASE = b"-"
_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")
_SEGMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_CONFIG_VALUES = (bool, int, float, str, bytes)

Buffer = bytes | bytearray | memoryview


def pack_task(message: Message, context: Context, *, content_segment: str | None = None) -> Parts:
    """A task: ``message`` for the node of ``context``.

    With ``content_segment``, the content is left out: the worker reads it from that
    segment, which holds :func:`~fedcore.wire.pack_recorddict_parts` of it.
    """
    blobs: list[memoryview] = []
    content = None if content_segment is not None else encode_recorddict(message.content, blobs)
    header = [
        encode_metadata(message.metadata),
        content,
        None if content_segment is None else _sendable_name(content_segment),
        _encode_context(context, blobs),
    ]
    return frame.encode_parts(frame.TASK, header, blobs)


def unpack_task(
    data: Buffer,
    read_segment: Callable[[str], RecordDict],
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[Message, Context]:
    """Decode a task; ``read_segment(name)`` supplies content that travelled by segment."""
    header, reader = frame.decode(data, frame.TASK, limits)
    if not isinstance(header, list) or len(header) != 4:
        fail("a task header must be a list of 4 fields")
    fields, content, segment, context = header
    if (content is None) == (segment is None):
        fail("a task carries its content or names a segment holding it, exactly one")
    metadata = decode_metadata(fields)
    records = (
        decode_recorddict(content, reader, limits)
        if content is not None
        else read_segment(check_segment_name(segment))
    )
    decoded_context = _decode_context(context, reader, limits)
    reader.finish()
    return assemble_message(metadata, content=records), decoded_context


def pack_outcome(reply: Message, state: RecordDict) -> Parts:
    """An outcome: the handler's reply and the node's state after it."""
    blobs: list[memoryview] = []
    header = [encode_message(reply, blobs), encode_recorddict(state, blobs)]
    return frame.encode_parts(frame.OUTCOME, header, blobs)


def unpack_outcome(
    data: Buffer, limits: DecodeLimits = DEFAULT_LIMITS
) -> tuple[Message, RecordDict]:
    header, reader = frame.decode(data, frame.OUTCOME, limits)
    if not isinstance(header, list) or len(header) != 2:
        fail("an outcome header must be a list of 2 fields")
    reply = decode_message(header[0], reader, limits)
    state = decode_recorddict(header[1], reader, limits)
    reader.finish()
    return reply, state


def pack_outcomes(outcomes: Sequence[Parts], seconds: float) -> Parts:
    """The ``outcomes`` of a batch's tasks (:func:`pack_outcome` each), and the
    ``seconds`` they took; no outcome is copied."""
    sizes = [parts_size(parts) for parts in outcomes]
    packed = frame.encode_parts(frame.OUTCOMES, [float(seconds), sizes], [])
    position = parts_size(packed)
    for parts, size in zip(outcomes, sizes, strict=True):
        pad = -position % ALIGNMENT
        if pad:
            packed.append(bytes(pad))
        packed += parts
        position += pad + size
    return packed


def unpack_outcomes(
    data: Buffer, limits: DecodeLimits = DEFAULT_LIMITS
) -> tuple[list[memoryview], float]:
    """Views of each outcome of a batch (for :func:`unpack_outcome`), and their seconds."""
    header, reader = frame.decode(data, frame.OUTCOMES, limits)
    if not isinstance(header, list) or len(header) != 2:
        fail("a batch's outcomes header must be a list of 2 fields")
    seconds, sizes = header
    if type(seconds) is not float or not math.isfinite(seconds) or seconds < 0:
        fail("a batch's seconds must be a finite float, not negative")
    if not isinstance(sizes, list) or not all(type(size) is int and size >= 0 for size in sizes):
        fail("a batch's outcome sizes must be a list of non-negative ints")
    views = [reader.take(size, f"outcome {index}") for index, size in enumerate(sizes)]
    reader.finish()
    return views, seconds


SpecValue = str | int | list[str]


def pack_spec(spec: Mapping[str, SpecValue]) -> bytes:
    return frame.encode(frame.SPEC, [[key, value] for key, value in spec.items()], [])


def unpack_spec(data: Buffer, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    header, reader = frame.decode(data, frame.SPEC, limits)
    reader.finish()
    if not isinstance(header, list):
        fail("a worker spec must be a list of [name, value] pairs")
    spec: dict[str, Any] = {}
    for pair in header:
        if not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not str:
            fail("a worker spec must be a list of [name, value] pairs")
        key, value = pair
        strings = isinstance(value, list) and all(type(item) is str for item in value)
        if key in spec or not (type(value) in (str, int) or strings):
            fail(f"worker spec entry {key!r} is repeated or not a str, int or list of str")
        spec[key] = value
    return spec


def pack_pointer(segment: str) -> bytes:
    return POINTER + _sendable_name(segment).encode("ascii")


def pointer_target(data: Buffer) -> str | None:
    """The segment a pointer names, or ``None`` if ``data`` is not a pointer."""
    return _named(data, POINTER)


def pack_release(segment: str) -> bytes:
    return RELEASE + _sendable_name(segment).encode("ascii")


def release_target(data: Buffer) -> str | None:
    """The segment a release names, or ``None`` if ``data`` is not a release."""
    return _named(data, RELEASE)


def _named(data: Buffer, marker: bytes) -> str | None:
    view = memoryview(data)
    if bytes(view[:1]) != marker:
        return None
    try:
        name = bytes(view[1:]).decode("ascii")
    except UnicodeDecodeError:
        fail("a segment name must be ASCII")
    return check_segment_name(name)


def pack_failure(reason: str) -> bytes:
    return FAILED + reason.encode("utf-8", "replace")


def failure_reason(data: Buffer) -> str | None:
    """The reason of a worker's failed hello, or ``None`` if ``data`` is not one."""
    view = memoryview(data)
    if bytes(view[:1]) != FAILED:
        return None
    return bytes(view[1:]).decode("utf-8", "replace")


def _is_segment_name(name: object) -> bool:
    """A plain file name: no separators, no dot-dot."""
    return isinstance(name, str) and bool(_SEGMENT_NAME.fullmatch(name)) and ".." not in name


def _sendable_name(name: str) -> str:
    """``name`` if it is a segment name; a bad one is the sender's bug, a ValueError."""
    if not _is_segment_name(name):
        raise ValueError(f"{name!r} is not a segment name")
    return name


def check_segment_name(name: object) -> str:
    """``name`` if it is a segment name; a bad one received is a DecodeError."""
    if not _is_segment_name(name):
        fail(f"{name!r} is not a segment name")
    assert isinstance(name, str)
    return name


def _encode_context(context: Context, blobs: list[memoryview]) -> list[Any]:
    return [
        _encode_id("run_id", context.run_id),
        _encode_id("node_id", context.node_id),
        _encode_config("node_config", context.node_config),
        _encode_config("run_config", context.run_config),
        encode_recorddict(context.state, blobs),
    ]


def _encode_id(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"context {name} must be an int, got {type(value).__name__}")
    return value


def _encode_config(name: str, config: dict[str, Any]) -> list[list[Any]]:
    pairs = []
    for key, value in config.items():
        if not isinstance(key, str) or not isinstance(value, _CONFIG_VALUES):
            raise TypeError(
                f"context {name}[{key!r}] must be bool, int, float, str or bytes, "
                f"got {type(value).__name__}"
            )
        pairs.append([key, value])
    return pairs


def _decode_context(header: object, reader: frame.BlobReader, limits: DecodeLimits) -> Context:
    if not isinstance(header, list) or len(header) != 5:
        fail("a context must be a list of 5 fields")
    run_id, node_id, node_config, run_config, state = header
    for name, value in (("run_id", run_id), ("node_id", node_id)):
        if type(value) is not int:
            fail(f"context {name} must be an int, got {type(value).__name__}")
    return Context(
        run_id,
        node_id,
        _decode_config("node_config", node_config),
        decode_recorddict(state, reader, limits),
        _decode_config("run_config", run_config),
    )


def _decode_config(name: str, pairs: object) -> dict[str, Any]:
    if not isinstance(pairs, list):
        fail(f"context {name} must be a list of pairs")
    config: dict[str, Any] = {}
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            fail(f"context {name} must be a list of [key, value] pairs")
        key, value = pair
        if type(key) is not str or type(value) not in _CONFIG_VALUES or key in config:
            fail(f"context {name} has a bad or repeated entry for {key!r}")
        config[key] = value
    return config


def framed(*messages: bytes) -> bytes:
    """``messages`` framed for the pipe, ready for one write."""
    parts: list[bytes] = []
    for message in messages:
        if len(message) > 0x7FFFFFFF:
            parts += [_LENGTH.pack(-1), _LONG_LENGTH.pack(len(message))]
        else:
            parts.append(_LENGTH.pack(len(message)))
        parts.append(message)
    return b"".join(parts)


class Deframer:
    """Splits bytes read from the pipe, in whatever pieces they came, into messages."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, data: Buffer) -> list[bytes]:
        """Take ``data``; return every message now complete, in order."""
        pending = self._pending
        pending += data
        messages: list[bytes] = []
        start = 0
        while len(pending) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(pending, start)
            header = _LENGTH.size
            if size == -1:
                if len(pending) - start < header + _LONG_LENGTH.size:
                    break
                (size,) = _LONG_LENGTH.unpack_from(pending, start + header)
                header += _LONG_LENGTH.size
            elif size < 0:
                fail(f"a pipe frame claims a length of {size}")
            end = start + header + size
            if len(pending) < end:
                break
            messages.append(bytes(pending[start + header : end]))
            start = end
        del pending[:start]
        return messages
