"""The wire codec: RecordDicts and Messages to bytes and back, with msgpack and no pickle.

This package is the only place fedcore touches msgpack. Decoding never trusts its
input: anything that is not a valid payload within :class:`DecodeLimits` raises
:class:`fedcore.errors.DecodeError`, and arrays come back as read-only views into the
input buffer. See :mod:`fedcore.wire.frame` for the layout.
"""

from fedcore.wire.frame import DEFAULT_LIMITS, FORMAT_VERSION, DecodeLimits
from fedcore.wire.message import pack_message, unpack_message
from fedcore.wire.records import pack_recorddict, unpack_recorddict

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "DecodeLimits",
    "pack_message",
    "pack_recorddict",
    "unpack_message",
    "unpack_recorddict",
]
