"""The fleet's vocabulary: what a node and the link say to each other, whatever carries it.

A node pulls :class:`LeasedMessage` s (:class:`PulledMessages`), fetches content that
travels apart as a payload (:class:`PayloadRef`), and hears that its reply is held
(:class:`PushedReply`); payloads and app bundles are checked against a :class:`Digest`.
Roles speak these types; ``fedcore.wire`` alone turns them into bytes and back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedcore.domain.message import Message

_SHA256_SIZE = 32
_UINT64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Digest:
    """The size and SHA-256 of a payload or app bundle: what its receiver checks it against."""

    size: int
    sha256: bytes

    def __post_init__(self) -> None:
        if type(self.size) is not int or not 0 <= self.size <= _UINT64_MAX:
            raise ValueError(f"Digest.size must be an int from 0 to 2**64-1, got {self.size!r}")
        if type(self.sha256) is not bytes or len(self.sha256) != _SHA256_SIZE:
            got = (
                f"{len(self.sha256)} bytes"
                if isinstance(self.sha256, bytes)
                else "a " + type(self.sha256).__name__
            )
            raise ValueError(f"Digest.sha256 must be {_SHA256_SIZE} bytes, got {got}")

    @classmethod
    def of(
        cls, data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]
    ) -> Digest:
        """The digest of ``data``, or of the payload that ``data``'s parts make."""
        parts = [data] if isinstance(data, bytes | bytearray | memoryview) else data
        hasher = hashlib.sha256()
        size = 0
        for part in parts:
            view = memoryview(part).cast("B")
            hasher.update(view)
            size += len(view)
        return cls(size, hasher.digest())


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a message's content is when it travels as a payload, and what it must be."""

    payload_id: str
    digest: Digest


@dataclass(frozen=True, slots=True)
class LeasedMessage:
    """A message handed to a node under a lease that ends at ``lease_expires_at``.

    When ``payload`` is set, the content travels separately as that payload
    (PullPayload): on the sending side ``message.content`` is not sent, and on the
    receiving side it is an empty RecordDict until the node fetches the payload and
    decodes it. Keeping the fetch out of the pull lets the node stream a large
    payload on instead of holding it whole.
    """

    message: Message
    lease_expires_at: float
    payload: PayloadRef | None = None


@dataclass(frozen=True, slots=True)
class PulledMessages:
    """What a pull got: the link's clock when it answered, and the leased messages."""

    now: float
    messages: tuple[LeasedMessage, ...]


@dataclass(frozen=True, slots=True)
class PushedReply:
    """The link holds the reply durably: the node may forget it."""

    reply_id: str
    duplicate: bool
    """True when an identical reply was stored before (the push was a retry)."""
