"""Message, its Metadata, and Error: the unit that travels between ServerApp and ClientApp.

A message from the ServerApp carries content to one node; the node's reply carries
either content or an :class:`Error`, never both. ``Message(...)`` stamps its creation
time, as Flower's does, from the context's clock (:func:`fedcore.clock.current_clock`:
the system clock unless a runtime or a test put another in place), and a reply's ttl
is what its message has left. Identity (``message_id``) and the run are filled in by
whoever stores the message (the Grid and the LinkState), which also stamps the time
it stored it: the link's clock is the one that decides expiry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, overload

from fedcore.clock import current_clock
from fedcore.domain.records import RecordDict
from fedcore.errors import MessageInitializationError

DEFAULT_TTL = 43_200.0
"""Seconds a message may wait for its reply before it expires (12 hours, as Flower)."""

SERVER_NODE_ID = 1
"""The sender id of every message a ServerApp pushes (Flower's SuperLink node id)."""

MESSAGE_CATEGORIES = frozenset({"train", "evaluate", "query", "system"})
"""What a message type names before its optional ``.action``."""
LEGACY_MESSAGE_TYPES = frozenset({"get_parameters", "get_properties"})
"""The message types of Flower's legacy ``get_parameters``/``get_properties`` calls,
which have no category and take no action (Flower's rule too)."""

TTL_TOLERANCE = 0.1
"""Seconds by which a reply's ttl may exceed what its message has left before it is cut
to that (Flower's tolerance)."""


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

    def describe(self) -> str:
        """The error in words for a log line: ``error 2 (CLIENT_APP_RAISED_EXCEPTION): ...``.

        ``str()`` is the repr, ``Error(code=2, reason='...')``, as Flower's.
        """
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
    copy, so it does not travel and takes no part in equality or the repr (which is
    Flower's: the nine fields in its order).
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
    delivered_at: str = field(default="", compare=False, repr=False)

    @property
    def expires_at(self) -> float:
        """When the message (and any reply to it) stops being deliverable."""
        return self.created_at + self.ttl


def mark_delivered(message: Message, at: float) -> None:
    """Stamp ``message`` as handed to its app at ``at`` (seconds since the epoch)."""
    message.metadata.delivered_at = datetime.fromtimestamp(at, UTC).isoformat()


def check_message_type(message_type: object) -> str:
    """Return ``message_type`` if it is ``<category>`` or ``<category>.<action>``, else raise
    ``ValueError``: the category one of :data:`MESSAGE_CATEGORIES`, the action a Python
    identifier (Flower's rule: ``train.fast_2``, not ``train.no-hyphen`` or ``train.123``);
    or one of :data:`LEGACY_MESSAGE_TYPES` as it is."""
    if message_type in LEGACY_MESSAGE_TYPES:
        return str(message_type)
    if isinstance(message_type, str):
        category, dot, action = message_type.partition(".")
        if category in MESSAGE_CATEGORIES and (not dot or action.isidentifier()):
            return message_type
    raise ValueError(
        f"message_type must be 'train', 'evaluate', 'query' or 'system', optionally with an "
        f"action that is a Python identifier, as in 'train.fast'; got {message_type!r}"
    )


def _check_ttl(ttl: float) -> float:
    if not (0 < ttl < math.inf):
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

    @overload
    def __init__(
        self,
        content: RecordDict,
        dst_node_id: int,
        message_type: str,
        *,
        ttl: float | None = None,
        group_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self, content: RecordDict, *, reply_to: Message, ttl: float | None = None
    ) -> None: ...

    @overload
    def __init__(self, error: Error, *, reply_to: Message, ttl: float | None = None) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build from one of the three forms above; anything else raises
        :class:`~fedcore.errors.MessageInitializationError` (a ``TypeError``), an
        unknown message type or a ttl that is not positive a ``ValueError``."""
        parts = _MessageArguments.parse(args, kwargs)
        self._content, self._error = parts.content, parts.error
        now = current_clock().now()
        if parts.reply_to is not None:
            self.metadata = _reply_metadata(parts.reply_to, now, parts.ttl)
            return
        dst_node_id, message_type = parts.destination()
        self.metadata = Metadata(
            dst_node_id=dst_node_id,
            message_type=check_message_type(message_type),
            group_id=parts.group_id or "",
            created_at=now,
            ttl=DEFAULT_TTL if parts.ttl is None else _check_ttl(parts.ttl),
        )

    @property
    def content(self) -> RecordDict:
        """The records carried; raises ``ValueError`` on an error reply (see :attr:`error`)."""
        if self._content is None:
            raise ValueError(f"this message carries an error, not content: {self.error.describe()}")
        return self._content

    @content.setter
    def content(self, value: RecordDict) -> None:
        """Replace the content; ``ValueError`` on a message that carries an error."""
        if self._error is not None:
            raise ValueError("a message that carries an error cannot be given content")
        if not isinstance(value, RecordDict):
            raise TypeError(f"Message content must be a RecordDict, got {type(value).__name__}")
        self._content = value

    @property
    def error(self) -> Error:
        """The error carried; raises ``ValueError`` on a message with content."""
        if self._error is None:
            raise ValueError("this message carries content, not an error")
        return self._error

    @error.setter
    def error(self, value: Error) -> None:
        """Replace the error; ``ValueError`` on a message that carries content."""
        if self._content is not None:
            raise ValueError("a message that carries content cannot be given an error")
        if not isinstance(value, Error):
            raise TypeError(f"Message error must be an Error, got {type(value).__name__}")
        self._error = value

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
        """Flower's: ``Message(metadata=Metadata(...), content=RecordDict(...))``."""
        body = f"error={self._error!r}" if self._error is not None else f"content={self._content!r}"
        return f"Message(metadata={self.metadata!r}, {body})"


def assemble_message(
    metadata: Metadata, content: RecordDict | None = None, error: Error | None = None
) -> Message:
    """Put a message together from stored or decoded parts.

    For the code that rebuilds messages (the wire decoder, LinkStates), which has
    already checked each part; authors build messages with ``Message(...)``.
    """
    if (content is None) == (error is None):
        raise MessageInitializationError(
            "a Message carries either content or an error, exactly one"
        )
    message = Message.__new__(Message)
    message.metadata, message._content, message._error = metadata, content, error
    return message


_KEYWORDS = frozenset({"content", "error", "dst_node_id", "message_type", "group_id", "ttl"})


@dataclass(frozen=True, slots=True)
class _MessageArguments:
    """The arguments of ``Message(...)``, sorted into its forms and type-checked."""

    content: RecordDict | None
    error: Error | None
    dst_node_id: int | None
    message_type: str | None
    group_id: str | None
    ttl: float | None
    reply_to: Message | None

    @classmethod
    def parse(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _MessageArguments:
        """Flower's reading of ``Message(...)``: the first positional argument is the
        content or the error, the next two the destination and the message type."""
        unknown = sorted(set(kwargs) - _KEYWORDS - {"reply_to"})
        if unknown:
            raise MessageInitializationError(f"Message() takes no argument {unknown[0]!r}")
        if len(args) > 3:
            raise MessageInitializationError(
                f"Message() takes at most 3 positional arguments, got {len(args)}"
            )
        given = dict(kwargs)
        for name, value in zip(("dst_node_id", "message_type"), args[1:], strict=False):
            if given.get(name) is not None:
                raise MessageInitializationError(f"Message() got {name} twice")
            given[name] = value
        first = (args[0] if args else None, given.get("content"), given.get("error"))
        if sum(x is not None for x in first) != 1:
            raise MessageInitializationError(
                "a Message carries either content or an error, exactly one"
            )
        if args and args[0] is not None:
            if not isinstance(args[0], RecordDict | Error):
                raise MessageInitializationError(
                    f"Message content must be a RecordDict or an Error, "
                    f"got {type(args[0]).__name__}"
                )
            given["error" if isinstance(args[0], Error) else "content"] = args[0]
        parts = cls(**{name: given.get(name) for name in (*_KEYWORDS, "reply_to")})
        parts._check_types()
        parts._check_form()
        return parts

    def _check_types(self) -> None:
        expected = (
            ("content", self.content, RecordDict),
            ("error", self.error, Error),
            ("dst_node_id", self.dst_node_id, int),
            ("message_type", self.message_type, str),
            ("group_id", self.group_id, str),
            ("ttl", self.ttl, int | float),
            ("reply_to", self.reply_to, Message),
        )
        for name, value, kind in expected:
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise MessageInitializationError(
                    f"Message {name} has the wrong type: {type(value).__name__}"
                )

    def _check_form(self) -> None:
        if self.reply_to is not None:
            if (self.dst_node_id, self.message_type, self.group_id) != (None, None, None):
                raise MessageInitializationError(
                    "a reply takes its destination, message type and group from reply_to; "
                    "do not pass dst_node_id, message_type or group_id"
                )
            return
        if self.content is None:
            raise MessageInitializationError(
                "only a reply can carry an error: pass reply_to=the message"
            )
        self.destination()

    def destination(self) -> tuple[int, str]:
        """``dst_node_id`` and ``message_type`` of a message that is not a reply."""
        if self.dst_node_id is None or self.message_type is None:
            raise MessageInitializationError(
                "a message that is not a reply needs content, dst_node_id and message_type"
            )
        return self.dst_node_id, self.message_type


def _reply_metadata(original: Message, now: float, ttl: float | None) -> Metadata:
    """A reply's metadata: routed back to the sender, created ``now``, its ttl at most
    what ``original`` has left (the asked-for ``ttl`` if within :data:`TTL_TOLERANCE`
    of that), never more than its ttl. A message with no time left — already expired,
    or stamped by a clock ahead of this one — bounds nothing here; the link that
    stores the reply does."""
    meta = original.metadata
    left = min(meta.expires_at - now, meta.ttl)
    if ttl is not None:
        ttl = _check_ttl(ttl)
    if 0 < left < math.inf and (ttl is None or ttl - left > TTL_TOLERANCE):
        ttl = left
    return Metadata(
        run_id=meta.run_id,
        src_node_id=meta.dst_node_id,
        dst_node_id=meta.src_node_id,
        reply_to_message_id=meta.message_id,
        group_id=meta.group_id,
        created_at=now,
        ttl=meta.ttl if ttl is None else ttl,
        message_type=meta.message_type,
    )
