"""The wire codec: RecordDicts and Messages to bytes and back, with msgpack and no pickle.

This package is the only place fedcore touches msgpack. Decoding never trusts its
input: anything that is not a valid payload within :class:`DecodeLimits` raises
:class:`fedcore.errors.DecodeError`, and arrays come back as read-only views into the
input buffer. See :mod:`fedcore.wire.frame` for the layout.
"""

from fedcore.wire.frame import (
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MAX_VALUE_LEN,
    STORED_LIMITS,
    DecodeLimits,
    Parts,
    parts_size,
)
from fedcore.wire.message import pack_message, unpack_message
from fedcore.wire.records import pack_recorddict, pack_recorddict_parts, unpack_recorddict

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "MAX_VALUE_LEN",
    "STORED_LIMITS",
    "DecodeLimits",
    "Parts",
    "pack_message",
    "pack_recorddict",
    "pack_recorddict_parts",
    "parts_size",
    "unpack_message",
    "unpack_recorddict",
]
