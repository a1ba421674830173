"""Lifecycles as data: every allowed status change is one row of a table.

Theory of operation. A run and a message each move through a small set of
statuses. Code never assigns a status directly; it asks :func:`transition` for the
move, which raises :class:`~fedcore.errors.InvalidTransitionError` unless the table
lists it. Tests walk the whole table, so an unlisted move is a bug found at once
rather than a state seen in production.

Runs::

    pending ──> starting ──> running ──> finished:completed
       ▲  │        │  │         ├──────> finished:failed
       │  │        │  │         └──────> finished:stopped
       │  └────────┴──┴──> finished:failed / finished:stopped   (never started)
       └───────────┘  claim expired: the exec that claimed it is gone; try again

Messages (ServerApp → node), inside a LinkState::

    pending ──pull──> leased ──reply──> replied ──ack──> acknowledged
       ▲                │                  ▲
       └─lease expires──┘                  │
    pending / leased ── node gone, TTL passed, undeliverable ──> replied (an error reply)
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from fedcore.errors import InvalidTransitionError


class RunStatus(StrEnum):
    """Where a run is in its life. ``finished:*`` statuses are final."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "finished:completed"
    FAILED = "finished:failed"
    STOPPED = "finished:stopped"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished:")


RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.PENDING: frozenset({RunStatus.STARTING, RunStatus.FAILED, RunStatus.STOPPED}),
    RunStatus.STARTING: frozenset(
        {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.STOPPED}
    ),
    RunStatus.RUNNING: frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.STOPPED: frozenset(),
}


class MessageStatus(StrEnum):
    """Where a ServerApp's message is on its way to a reply."""

    PENDING = "pending"
    LEASED = "leased"
    REPLIED = "replied"
    ACKNOWLEDGED = "acknowledged"


MESSAGE_TRANSITIONS: dict[MessageStatus, frozenset[MessageStatus]] = {
    MessageStatus.PENDING: frozenset({MessageStatus.LEASED, MessageStatus.REPLIED}),
    MessageStatus.LEASED: frozenset({MessageStatus.PENDING, MessageStatus.REPLIED}),
    MessageStatus.REPLIED: frozenset({MessageStatus.ACKNOWLEDGED}),
    MessageStatus.ACKNOWLEDGED: frozenset(),
}

_S = TypeVar("_S", RunStatus, MessageStatus)


def transition(current: _S, new: _S) -> _S:
    """Return ``new`` if the table allows ``current -> new``, else raise."""
    table: dict[_S, frozenset[_S]] = (
        RUN_TRANSITIONS if isinstance(current, RunStatus) else MESSAGE_TRANSITIONS
    )
    if new not in table[current]:
        kind = "run" if isinstance(current, RunStatus) else "message"
        raise InvalidTransitionError(f"a {kind} cannot go from {current} to {new}")
    return new
