"""Many Messages in one payload, each distinct content packed once.

A ServerApp usually sends one model to many nodes: the same RecordDict object is the
content of every message of a round. Packed one by one, fifty messages would carry
the model fifty times. A batch packs each distinct content object once (by identity,
``is``) and lets its messages refer to it by position; unpacking gives them one
shared RecordDict again, as they had at the sender. Contents that are equal but are
different objects are packed separately: finding equal arrays would cost as much as
sending them, and the sender's sharing says what it meant.

The header is ``[contents, messages]``. ``contents`` lists RecordDict headers (see
:mod:`fedcore.wire.records`) in the order their messages come; ``messages`` lists
each message as a Message header does (:mod:`fedcore.wire.message`), except that its
content is the position of that content in ``contents``. Every content is used by
some message, so a batch has one encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from fedcore.domain.message import Message, assemble_message
from fedcore.domain.records import RecordDict
from fedcore.wire import frame
from fedcore.wire.frame import ALIGNMENT, DEFAULT_LIMITS, DecodeLimits, fail
from fedcore.wire.message import decode_message, decode_metadata, encode_message, encode_metadata
from fedcore.wire.records import decode_recorddict, encode_recorddict

_FIXED_OVERHEAD = 32
"""Bytes of a batch that no message accounts for: the prefix and the two list headers."""
_LARGEST_POSITION = 5
"""Bytes a content position takes in msgpack at most (a uint32)."""


def pack_batch(messages: Sequence[Message]) -> bytes:
    """Encode ``messages``; each distinct content's arrays are copied once, into the result."""
    return b"".join(pack_batch_parts(messages))


def pack_batch_parts(messages: Sequence[Message]) -> frame.Parts:
    """Encode ``messages`` as parts to write out; the arrays are not copied."""
    contents: list[Any] = []
    entries: list[Any] = []
    positions: dict[int, int] = {}
    blobs: list[memoryview] = []
    for msg in messages:
        if not msg.has_content():
            entries.append(encode_message(msg, blobs))  # an error: no arrays
            continue
        position = positions.get(id(msg.content))
        if position is None:
            position = positions[id(msg.content)] = len(contents)
            contents.append(encode_recorddict(msg.content, blobs))
        entries.append([encode_metadata(msg.metadata), position, None])
    return frame.encode_parts(frame.BATCH, [contents, entries], blobs)


def unpack_batch(
    data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS
) -> list[Message]:
    """Decode :func:`pack_batch` output; messages that shared a content share it again.

    Arrays are read-only views into ``data``.
    """
    header, reader = frame.decode(data, frame.BATCH, limits)
    if not isinstance(header, list) or len(header) != 2:
        fail("a batch header must be a list of 2 fields")
    content_headers, entries = header
    if not isinstance(content_headers, list) or not isinstance(entries, list):
        fail("a batch's contents and messages must be lists")
    contents = [decode_recorddict(content, reader, limits) for content in content_headers]
    unused = set(range(len(contents)))
    messages: list[Message] = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 3:
            fail("a message in a batch must be a list of 3 fields")
        fields, position, error = entry
        if position is None:
            messages.append(decode_message(entry, reader, limits))
            continue
        if error is not None:
            fail("a message carries either content or an error, exactly one")
        if type(position) is not int or not 0 <= position < len(contents):
            fail(f"a message's content position {position!r} is not one of the batch's")
        unused.discard(position)
        messages.append(assemble_message(decode_metadata(fields), content=contents[position]))
    if unused:
        fail(f"the batch has {len(unused)} contents that no message uses")
    reader.finish()
    return messages


def batch_prefix(messages: Sequence[Message], max_bytes: int) -> int:
    """How many of the first ``messages`` fit one :func:`pack_batch` of at most ``max_bytes``.

    At least one when there are messages at all, even one alone over ``max_bytes``:
    a sender that splits a long list with this always makes progress, and the
    receiver's cap refuses what is too large with a clear error. The estimate is an
    upper bound, so what it counts in fits.
    """
    size = _FIXED_OVERHEAD
    seen: set[int] = set()
    for count, msg in enumerate(messages):
        size += _entry_size(msg)
        if msg.has_content() and id(msg.content) not in seen:
            seen.add(id(msg.content))
            size += _content_size(msg.content)
        if size > max_bytes and count > 0:
            return count
    return len(messages)


def _entry_size(msg: Message) -> int:
    if msg.has_content():
        return len(msgpack.packb(encode_metadata(msg.metadata))) + _LARGEST_POSITION + 2
    return len(msgpack.packb(encode_message(msg, [])))


def _content_size(records: RecordDict) -> int:
    blobs: list[memoryview] = []
    header = encode_recorddict(records, blobs)
    return len(msgpack.packb(header)) + sum(blob.nbytes + ALIGNMENT - 1 for blob in blobs)
