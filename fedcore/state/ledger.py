"""The link's rules for nodes, runs and messages, apart from where they are kept.

A LinkState is a store and a scheduler: ``memory.py`` keeps its facts in dicts,
``sqlite.py`` in tables, and neither decides anything. Each decision is a pure function
here — the facts and the event in, the effect out: a new status (every one asked of
the one transition table, :func:`fedcore.domain.lifecycle.transition`), a stamped
message or reply, what a run's move drops, or the error to raise. Both stores apply
the same effects, so the conformance suites test one set of rules twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedcore.domain import (
    SERVER_NODE_ID,
    Error,
    ErrorCode,
    Message,
    MessageStatus,
    Metadata,
    MetricsLine,
    RunStatus,
    transition,
)
from fedcore.domain.lifecycle import MESSAGE_TRANSITIONS
from fedcore.domain.message import assemble_message
from fedcore.errors import (
    ClaimLostError,
    ConflictError,
    InvalidTransitionError,
    MessageNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunFinishedError,
)

MAX_CLAIM_ATTEMPTS = 3
"""How many claims of one run may run out before the run is ``finished:failed``."""

# Ids ----------------------------------------------------------------------------------


def new_id(ids: random.Random, taken: Callable[[int], bool]) -> int:
    """A fresh node or run id from ``ids``: 63 bits, above the server's id, not ``taken``."""
    while True:
        candidate = ids.getrandbits(63)
        if candidate > SERVER_NODE_ID and not taken(candidate):
            return candidate


def new_message_id(ids: random.Random, taken: Callable[[str], bool]) -> str:
    """A fresh message or reply id from ``ids``: 32 lowercase hex digits, not ``taken``."""
    while True:
        message_id = f"{ids.getrandbits(128):032x}"
        if not taken(message_id):
            return message_id


def check_message_id(message_id: str) -> None:
    """Refuse a message id a ServerApp chose that is not 32 lowercase hex digits."""
    if len(message_id) != 32 or message_id.strip("0123456789abcdef"):
        raise ValueError(f"a message id is 32 lowercase hex digits, got {message_id[:40]!r}")


# Nodes ----------------------------------------------------------------------------------


def check_heartbeat_interval(heartbeat_interval: float) -> None:
    """Refuse a heartbeat interval that is not a positive number of seconds."""
    if not heartbeat_interval > 0:
        raise ValueError(f"heartbeat_interval must be positive, got {heartbeat_interval}")


def check_retirement(offline_for: float) -> None:
    """Refuse a retirement age that is not a finite number of seconds, 0 or more."""
    if not (offline_for >= 0 and math.isfinite(offline_for)):
        raise ValueError(f"offline_for must be finite and not negative, got {offline_for}")


def silent_at(now: float, patience: float, heartbeat_interval: float) -> float:
    """When a node (or a ServerApp) heard ``now`` is silent: ``patience`` intervals on."""
    return now + patience * heartbeat_interval


def check_lease(lease: float) -> None:
    """Refuse a lease (of a message or a claim) that is not a positive number of seconds."""
    if not lease > 0:
        raise ValueError(f"lease must be positive, got {lease}")


# Messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """fedcore's own error reply to a message that can no longer be answered."""

    code: ErrorCode
    reason: str


def check_takes_messages(run_id: int, status: RunStatus) -> None:
    """Refuse a push to a finished run."""
    if status.finished:
        raise RunFinishedError(f"run {run_id} is {status}; it takes no messages")


def check_chosen_id(run_id: int, message_id: str, owner: int | None) -> bool:
    """Whether a message id the ServerApp chose is a retry (``owner``, the run holding it,
    is this one); refuse a malformed id or one another run holds."""
    check_message_id(message_id)
    if owner is not None and owner != run_id:
        raise ConflictError(f"message id {message_id} is taken")
    return owner is not None


def stamp_message(meta: Metadata, run_id: int, now: float, message_id: str) -> None:
    """Stamp a pushed message: its run, the server as sender, ``now`` and ``message_id``
    (the one the ServerApp chose, if it did)."""
    meta.run_id, meta.src_node_id, meta.created_at = run_id, SERVER_NODE_ID, now
    meta.message_id = message_id


def on_arrival(node_id: int, online: bool) -> Answer | None:
    """What a pushed message meets: ``None`` (delivered) or the answer for a node not online."""
    return None if online else Answer(ErrorCode.NODE_UNAVAILABLE, f"node {node_id} is not online")


def is_open(status: MessageStatus) -> bool:
    """Whether a message still waits for its reply: the table lets it be answered."""
    return MessageStatus.REPLIED in MESSAGE_TRANSITIONS[status]


def lease(status: MessageStatus) -> MessageStatus:
    """A node pulls the message."""
    return transition(status, MessageStatus.LEASED)


def lease_ends(status: MessageStatus) -> MessageStatus:
    """The message's lease ran out without a reply: deliverable again."""
    return transition(status, MessageStatus.PENDING)


def expired(ttl: float) -> Answer:
    """The answer to an open message whose TTL passed."""
    return Answer(
        ErrorCode.MESSAGE_UNAVAILABLE, f"message expired: no reply within its TTL of {ttl:g} s"
    )


def node_gone(node_id: int, why: str) -> Answer:
    """The answer to an open message of a node gone offline or deleted (``why``)."""
    return Answer(ErrorCode.NODE_UNAVAILABLE, f"{why} ({node_id})")


NODE_SILENT = "node went offline: no heartbeat in time"
NODE_DELETED = "node was deleted"


def replied(status: MessageStatus) -> MessageStatus:
    """The message gets its reply (the node's, or fedcore's :class:`Answer`)."""
    return transition(status, MessageStatus.REPLIED)


def acknowledged(status: MessageStatus) -> MessageStatus:
    """The ServerApp has the reply: message and reply may go."""
    return transition(status, MessageStatus.ACKNOWLEDGED)


def reply_ttl(ttl: float, message: Metadata, now: float) -> float:
    """A reply's ttl: what it asked for, bounded by what remains of its message's, so that
    a reply never outlives its message (a message with no time left bounds nothing)."""
    left = message.expires_at - now
    return left if 0 < left < ttl else ttl


def stamp_reply(reply: Metadata, message: Metadata, now: float, reply_id: str) -> None:
    """Stamp a reply from the message it answers: run, sender (the message's node),
    destination (the server), group, ``now``, a bounded ttl and ``reply_id``."""
    reply.run_id, reply.src_node_id, reply.dst_node_id = (
        message.run_id,
        message.dst_node_id,
        SERVER_NODE_ID,
    )
    reply.reply_to_message_id, reply.message_type = message.message_id, message.message_type
    reply.group_id, reply.created_at = message.group_id, now
    reply.ttl = reply_ttl(reply.ttl, message, now)
    reply.message_id = reply_id


def answer_reply(message: Metadata, answer: Answer, now: float, reply_id: str) -> Message:
    """fedcore's error reply to ``message``, stamped as a node's reply would be."""
    metadata = Metadata(ttl=message.ttl)
    stamp_reply(metadata, message, now, reply_id)
    return assemble_message(metadata, error=Error(int(answer.code), answer.reason))


def check_reply(node_id: int, message: Metadata | None, reply: Message) -> Metadata:
    """The message ``reply`` answers, if ``node_id`` may answer it with that type."""
    if message is None or message.dst_node_id != node_id:
        reply_to = reply.metadata.reply_to_message_id
        raise MessageNotFoundError(f"node {node_id} has no message {reply_to!r} to reply to")
    check_reply_type(reply, message.message_type)
    return message


def check_reply_type(reply: Message, message_type: str) -> None:
    """Refuse a reply whose type is not that of the message it answers."""
    if reply.metadata.message_type != message_type:
        raise ReplyRejectedError(
            f"reply type {reply.metadata.message_type!r} does not match "
            f"message type {message_type!r}"
        )


def repeated_reply(message_id: str, stored_id: str, answered: str | None, same: bool) -> str:
    """A reply to message ``message_id``, which has its reply ``stored_id`` already: that
    id if the new one repeats it (``same``), else why it cannot be stored — ``answered``
    is the reason of fedcore's own answer, if the stored reply is one."""
    if answered is not None:
        raise ReplyRejectedError(f"message already answered by fedcore: {answered}")
    if not same:
        raise ConflictError(f"message {message_id!r} already has a different reply")
    return stored_id


def unknown_message_reply(run_id: int, message_id: str) -> Message:
    """The error reply ``get_replies`` gives for an id the run does not hold.

    Its type is ``system`` (as Flower's answer to the same question): the message,
    and so its type, is unknown, and a reply must carry a valid type to cross the
    wire — a deployed ServerApp gets this very reply in a batch.
    """
    metadata = Metadata(
        run_id=run_id,
        dst_node_id=SERVER_NODE_ID,
        reply_to_message_id=message_id,
        message_type="system",
    )
    reason = f"run {run_id} has no message {message_id!r} (never pushed, or already acknowledged)"
    return assemble_message(metadata, error=Error(int(ErrorCode.MESSAGE_UNAVAILABLE), reason))


# Runs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunMove:
    """What a run's status change asks of its store, besides the status and reason.

    ``drop_claim``: the claim's token and launch secret go (back to ``pending``);
    ``end_claim``: its token and the ServerApp's deadline go, its secret stays, so the
    ServerApp can still log and learn the run is over, and the run's messages and
    replies go (finished).
    """

    status: RunStatus
    reason: str
    finished_at: float | None
    drop_claim: bool
    end_claim: bool


def move_run(current: RunStatus, status: RunStatus, reason: str, now: float) -> RunMove:
    """A run moves from ``current`` to ``status`` at ``now``, if the table allows it."""
    transition(current, status)
    return RunMove(
        status,
        reason,
        now if status.finished else None,
        drop_claim=status is RunStatus.PENDING,
        end_claim=status.finished,
    )


def claimed(current: RunStatus, now: float) -> RunMove:
    """An exec claims a pending run."""
    return move_run(current, RunStatus.STARTING, "", now)


def started(current: RunStatus, now: float) -> RunMove | None:
    """The claimant launched the ServerApp: ``starting → running``; ``None`` when the run
    runs already (a retry after a lost response: nothing to do)."""
    if current is RunStatus.RUNNING:
        return None
    return move_run(current, RunStatus.RUNNING, "", now)


def claim_expired(current: RunStatus, attempts: int, now: float) -> RunMove:
    """A ``starting`` run's claim ran out: back to pending, or failed after the last (R5)."""
    if attempts >= MAX_CLAIM_ATTEMPTS:
        reason = (
            f"no exec launched the run: its claim ran out {attempts} times "
            f"(the exec that claimed it died or hung each time)"
        )
        return move_run(current, RunStatus.FAILED, reason, now)
    reason = f"claim {attempts} ran out before its exec launched the run; waiting for another exec"
    return move_run(current, RunStatus.PENDING, reason, now)


def serverapp_silent(
    current: RunStatus, patience: float, heartbeat_interval: float, now: float
) -> RunMove:
    """A running run's ServerApp stopped heartbeating and no exec vouched for it (R4)."""
    reason = (
        f"the ServerApp went silent: no heartbeat for {patience * heartbeat_interval:g} s "
        f"({patience:g} × its interval of {heartbeat_interval:g} s), and no exec vouched "
        f"for its process meanwhile (its exec is gone)"
    )
    return move_run(current, RunStatus.FAILED, reason, now)


def check_claim_token(run_id: int, current: int | None, token: int) -> None:
    """Refuse ``token`` unless it is the run's live claim, ``current`` (None: no claim)."""
    if token != current:
        raise ClaimLostError(f"token {token} is not the claim of run {run_id}")


def check_running(run_id: int, status: RunStatus) -> None:
    """What ``heartbeat_run`` refuses: a finished run, and one not running yet."""
    if status.finished:
        raise RunFinishedError(f"run {run_id} is {status}: its ServerApp should end")
    if status is not RunStatus.RUNNING:
        raise InvalidTransitionError(f"run {run_id} is {status}, not running yet")


def new_launch_secret() -> tuple[str, bytes]:
    """A claim's launch secret, and its digest: all that a state keeps of it."""
    secret = secrets.token_urlsafe(32)
    return secret, _digest(secret)


def secret_matches(digest: bytes | None, secret: str) -> bool:
    """Whether ``secret`` is the one ``digest`` was made from, in constant time."""
    return digest is not None and hmac.compare_digest(digest, _digest(secret))


def _digest(secret: str) -> bytes:
    # surrogatepass: a secret from the network may hold any str; it then only fails to match.
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


# A run's record --------------------------------------------------------------------------

_ARTIFACT_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")


def check_artifact_name(name: str) -> None:
    """Refuse an artifact name that is not 1-64 lowercase letters, digits and dashes."""
    if not isinstance(name, str) or not _ARTIFACT_NAME.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else type(name).__name__
        raise ValueError(f"an artifact name is lowercase letters, digits and dashes, got {shown!r}")


def encode_metrics(documents: Sequence[dict[str, Any]]) -> list[str]:
    """Each metrics document as the JSON text a state keeps; ``ValueError``/``TypeError``
    for one that is not a JSON object (then none is kept).

    Non-finite numbers are written as ``metrics.jsonl`` writes them (``NaN``), so a
    diverged loss survives the trip.
    """
    if isinstance(documents, dict):
        raise TypeError("append_metrics takes a sequence of documents, not one")
    encoded = []
    for document in documents:
        if not isinstance(document, dict):
            raise TypeError(f"a metrics line is a JSON object, not {type(document).__name__}")
        encoded.append(json.dumps(document, separators=(",", ":")))
    return encoded


def decode_metrics(seq: int, text: str) -> MetricsLine:
    """A kept metrics line."""
    return MetricsLine(seq, json.loads(text))


def missing_artifact(run_id: int, name: str) -> NotFoundError:
    """What ``get_artifact`` raises for an artifact the run does not keep."""
    return NotFoundError(f"run {run_id} keeps no {name}")
