"""The runtime API in domain terms: what a ServerApp process asks of the link.

A ServerApp process launched for a run (by an exec) knows its run id and a launch
secret, given through an inherited pipe, never its environment or command line.
Every call presents both; :meth:`RuntimeService.authenticate` checks them and a
wrong pair looks exactly like an unknown run (``RunNotFoundError``). The link
implements the service over its LinkState (:mod:`fedcore.roles.link.runtime`);
:mod:`fedcore.transport.http.runtime` carries it over HTTP, and its client backs the
:class:`~fedcore.apps.grid.Grid` that a deployed ServerApp gets. A remote
implementation raises the same errors, plus
:class:`~fedcore.errors.LinkUnavailableError` while the link is away.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from fedcore.domain import Message, RecordDict, Run, RunStatus


class RuntimeService(ABC):
    """The link's side of the runtime API; every call is for the run ``run_id``."""

    @abstractmethod
    async def authenticate(self, run_id: int, secret: str) -> Run:
        """The run, if ``secret`` is its current launch secret; else ``RunNotFoundError``."""

    @abstractmethod
    async def heartbeat(self, run_id: int, heartbeat_interval: float) -> Run:
        """The ServerApp is alive. ``RunFinishedError`` once the run was stopped or failed."""

    @abstractmethod
    async def get_node_ids(
        self, run_id: int, *, at_least: int = 0, wait_seconds: float = 0.0
    ) -> list[int]:
        """The nodes online now; with ``at_least``, waits up to ``wait_seconds`` for that many.

        Returns when ``at_least`` nodes are online or the wait is over, whichever
        is first — woken by node events, never by polling.
        """

    @abstractmethod
    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        """Store messages for their nodes; return their ids. ``RunFinishedError`` if finished."""

    @abstractmethod
    async def pull_replies(
        self, run_id: int, message_ids: Sequence[str] | None, *, wait_seconds: float = 0.0
    ) -> list[Message]:
        """Replies available among ``message_ids``; waits up to ``wait_seconds`` for a first one.

        Replies stay stored until :meth:`ack_replies`, so a ServerApp that loses a
        response (or restarts) pulls them again. An id the run does not hold yields
        a ``MESSAGE_UNAVAILABLE`` error reply, as ``LinkState.get_replies`` does.
        ``None`` asks for every reply the run holds, oldest first ("pull any").
        """

    @abstractmethod
    async def ack_replies(self, run_id: int, message_ids: Sequence[str]) -> None:
        """The ServerApp has these replies; the link may delete them."""

    @abstractmethod
    async def save_context(self, run_id: int, state: RecordDict) -> None:
        """Keep the ServerApp's context state."""

    @abstractmethod
    async def load_context(self, run_id: int) -> RecordDict:
        """The ServerApp's context state last saved; empty when none was."""

    @abstractmethod
    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> None:
        """Add lines to the run's log (what the ServerApp printed and logged).

        ``batch`` names the append: sending the same batch again after a lost
        response appends nothing (``LinkState.append_logs``).
        """

    @abstractmethod
    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> None:
        """Add lines to the run's metrics: its header, then a line per finished round.

        ``batch`` names the append as for :meth:`append_logs`
        (``LinkState.append_metrics``).
        """

    @abstractmethod
    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        """Keep ``content`` as the run's artifact ``name`` (its final model: ``model``)."""

    @abstractmethod
    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        """The run's artifact ``name``; ``NotFoundError`` if it keeps none. A relaunched
        ServerApp reads the run's round checkpoint (``checkpoint``) this way."""

    @abstractmethod
    async def finish(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        """The ServerApp ends the run: ``finished:completed``, or ``finished:failed`` with why.

        A run already finished (stopped meanwhile) is returned as is.
        """
