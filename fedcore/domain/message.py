"""Message, its Metadata, and Error: the unit that travels between ServerApp and ClientApp.

A message from the ServerApp carries content to one node; the node's reply carries
either content or an :class:`Error`, never both. Identity (``message_id``), the run,
the sender and the timestamps are filled in by whoever stores the message (the
Grid and the LinkState), not by the code that builds it, so the domain never reads
a clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import IntEnum

from fedcore.domain.records import RecordDict

DEFAULT_TTL = 43_200.0
"""Seconds a message may wait for its reply before it expires (12 hours, as Flower)."""

SERVER_NODE_ID = 1
"""The sender id of every message a ServerApp pushes (Flower's SuperLink node id)."""

_MESSAGE_TYPE = re.compile(r"(train|evaluate|query|system)(\.[A-Za-z0-9_][A-Za-z0-9_-]*)?")


class MessageType:
    """The message types a ClientApp answers, as Flower names them: plain ``str`` constants.

    ``Message(content, node_id, MessageType.TRAIN)`` is ``Message(content, node_id,
    "train")``; an action goes after a dot (``f"{MessageType.TRAIN}.fast"``).
    """

    TRAIN = "train"
    EVALUATE = "evaluate"
    QUERY = "query"

    def __new__(cls) -> MessageType:
        raise TypeError("MessageType is a namespace of constants; use MessageType.TRAIN etc.")


class ErrorCode(IntEnum):
    """Why a reply carries an error instead of content (Flower's numbering)."""

    UNKNOWN = 0
    LOAD_CLIENT_APP_EXCEPTION = 1
    CLIENT_APP_RAISED_EXCEPTION = 2
    MESSAGE_UNAVAILABLE = 3
    REPLY_MESSAGE_UNAVAILABLE = 4
    NODE_UNAVAILABLE = 5
    MOD_FAILED_PRECONDITION = 6
    INVALID_FAB = 7
    CLIENT_APP_CRASHED = 8


@dataclass(frozen=True, slots=True)
class Error:
    """An error reply's payload: a code from :class:`ErrorCode` and a human reason."""

    code: int
    reason: str = ""

    def __str__(self) -> str:
        try:
            name = ErrorCode(self.code).name
        except ValueError:
            name = "UNKNOWN"
        return f"error {self.code} ({name}): {self.reason}" if self.reason else f"error {self.code}"


@dataclass(slots=True)
class Metadata:
    """Routing and bookkeeping of a message. Stamped by the Grid and the LinkState.

    ``delivered_at`` is when fedcore handed the message to the app that reads it — a
    message to its ClientApp, a reply to its ServerApp — as an ISO 8601 UTC string
    (Flower's format), and ``""`` before that. Each receiver stamps it on its own
    copy, so it does not travel and takes no part in equality.
    """

    run_id: int = 0
    message_id: str = ""
    src_node_id: int = 0
    dst_node_id: int = 0
    reply_to_message_id: str = ""
    group_id: str = ""
    created_at: float = 0.0
    ttl: float = DEFAULT_TTL
    message_type: str = ""
    delivered_at: str = field(default="", compare=False)

    @property
    def expires_at(self) -> float:
        """When the message (and any reply to it) stops being deliverable."""
        return self.created_at + self.ttl


def mark_delivered(message: Message, at: float) -> None:
    """Stamp ``message`` as handed to its app at ``at`` (seconds since the epoch)."""
    message.metadata.delivered_at = datetime.fromtimestamp(at, UTC).isoformat()


def check_message_type(message_type: object) -> str:
    """Return ``message_type`` if it names a known kind with an optional action, else raise."""
    if not isinstance(message_type, str) or not _MESSAGE_TYPE.fullmatch(message_type):
        raise ValueError(
            f"message_type must be 'train', 'evaluate', 'query' or 'system', optionally "
            f"with an action as in 'train.fast'; got {message_type!r}"
        )
    return message_type


def _check_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not (0 < ttl < math.inf):
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


class Message:
    """A message from the ServerApp to a node, or a node's reply.

    From the ServerApp::

        Message(content, dst_node_id, "train", group_id="round-1", ttl=600)
        Message(content, dst_node_id, message_type=MessageType.TRAIN)   # the same type

    From a ClientApp, replying to ``msg``::

        Message(content, reply_to=msg)
        Message(error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "..."), reply_to=msg)
    """

    __slots__ = ("_content", "_error", "metadata")

    def __init__(
        self,
        content: RecordDict | None = None,
        dst_node_id: int | None = None,
        message_type: str | None = None,
        *,
        error: Error | None = None,
        reply_to: Message | None = None,
        group_id: str | None = None,
        ttl: float | None = None,
    ) -> None:
        if (content is None) == (error is None):
            raise ValueError("a Message carries either content or an error, exactly one")
        if content is not None and not isinstance(content, RecordDict):
            raise TypeError(f"Message content must be a RecordDict, got {type(content).__name__}")
        if error is not None and not isinstance(error, Error):
            raise TypeError(f"Message error must be an Error, got {type(error).__name__}")
        self._content = content
        self._error = error
        if reply_to is not None:
            self.metadata = _reply_metadata(reply_to, dst_node_id, message_type, group_id, ttl)
            return
        if error is not None:
            raise ValueError("only a reply can carry an error: pass reply_to=the message")
        if isinstance(dst_node_id, bool) or not isinstance(dst_node_id, int):
            raise TypeError(f"dst_node_id must be an int node id, got {dst_node_id!r}")
        if group_id is not None and not isinstance(group_id, str):
            raise TypeError(f"group_id must be a str, got {type(group_id).__name__}")
        self.metadata = Metadata(
            dst_node_id=dst_node_id,
            message_type=check_message_type(message_type),
            group_id=group_id or "",
            ttl=_check_ttl(ttl) if ttl is not None else DEFAULT_TTL,
        )

    @property
    def content(self) -> RecordDict:
        """The records carried; raises ``ValueError`` on an error reply (see :attr:`error`)."""
        if self._content is None:
            raise ValueError(f"this message carries an error, not content: {self._error}")
        return self._content

    @content.setter
    def content(self, value: RecordDict) -> None:
        if not isinstance(value, RecordDict):
            raise TypeError(f"Message content must be a RecordDict, got {type(value).__name__}")
        self._content, self._error = value, None

    @property
    def error(self) -> Error:
        """The error carried; raises ``ValueError`` on a message with content."""
        if self._error is None:
            raise ValueError("this message carries content, not an error")
        return self._error

    @error.setter
    def error(self, value: Error) -> None:
        if not self.is_reply:
            raise ValueError("only a reply can carry an error")
        if not isinstance(value, Error):
            raise TypeError(f"Message error must be an Error, got {type(value).__name__}")
        self._content, self._error = None, value

    def has_content(self) -> bool:
        return self._content is not None

    def has_error(self) -> bool:
        return self._error is not None

    @property
    def is_reply(self) -> bool:
        return bool(self.metadata.reply_to_message_id)

    def with_content(self, content: RecordDict) -> Message:
        """A message with the same metadata (copied) and other content."""
        return assemble_message(replace(self.metadata), content=content)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.metadata == other.metadata
            and self._error == other._error
            and self._content == other._content
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        body = f"error={self._error!r}" if self._error is not None else f"content={self._content!r}"
        return f"Message({self.metadata!r}, {body})"


def assemble_message(
    metadata: Metadata, content: RecordDict | None = None, error: Error | None = None
) -> Message:
    """Put a message together from stored or decoded parts.

    For the code that rebuilds messages (the wire decoder, LinkStates), which has
    already checked each part; authors build messages with ``Message(...)``.
    """
    if (content is None) == (error is None):
        raise ValueError("a Message carries either content or an error, exactly one")
    message = Message.__new__(Message)
    message.metadata, message._content, message._error = metadata, content, error
    return message


def _reply_metadata(
    original: Message,
    dst_node_id: int | None,
    message_type: str | None,
    group_id: str | None,
    ttl: float | None,
) -> Metadata:
    if not isinstance(original, Message):
        raise TypeError(f"reply_to must be a Message, got {type(original).__name__}")
    if dst_node_id is not None or message_type is not None or group_id is not None:
        raise ValueError(
            "a reply takes its destination, message type and group from reply_to; "
            "do not pass dst_node_id, message_type or group_id"
        )
    if original.is_reply:
        raise ValueError("cannot reply to a reply")
    meta = original.metadata
    return Metadata(
        run_id=meta.run_id,
        src_node_id=meta.dst_node_id,
        dst_node_id=meta.src_node_id,
        reply_to_message_id=meta.message_id,
        group_id=meta.group_id,
        ttl=_check_ttl(ttl) if ttl is not None else meta.ttl,
        message_type=meta.message_type,
    )
