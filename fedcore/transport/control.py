"""The control API in domain terms: what ``fedcore run / ls / log / stop`` ask of the link.

:class:`ControlService` is implemented by the link over its LinkState
(:mod:`fedcore.roles.link.control`); the HTTP server in
:mod:`fedcore.transport.http.control` exposes any implementation as JSON, and
:class:`~fedcore.transport.http.control.HttpControlClient` implements it remotely,
so the CLI is written against this interface only. A remote implementation raises
the same errors, plus :class:`~fedcore.errors.LinkUnavailableError` when the link
cannot be reached.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedcore.domain import LogLine, MetricsLine, Run

if TYPE_CHECKING:  # types only: the fleet codec (betterproto) stays out of `fedcore ls`,
    from fedcore.domain import (
        RecordDict,  # and records (numpy) out of `fedcore log`
        UserConfigValue,
    )

__all__ = ["ControlService", "Health", "LogLine", "MetricsLine", "NodeInfo"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node the link knows, as ``fedcore ls --nodes`` shows it."""

    node_id: int
    online: bool


@dataclass(frozen=True, slots=True)
class Health:
    """What ``GET /v1/health`` says: the link's version and what it holds now."""

    version: str
    runs_active: int
    nodes_online: int


class ControlService(ABC):
    """The link's side of the control API."""

    @abstractmethod
    async def submit_run(self, bundle: bytes, run_config: Mapping[str, UserConfigValue]) -> Run:
        """Store ``bundle`` (a packed app directory) and create a pending run of it.

        ``run_config`` is the complete run config (the app's defaults with the
        user's overrides applied). A bundle that is not a valid app raises
        :class:`~fedcore.errors.BundleError`; one over the link's size cap too.
        """

    @abstractmethod
    async def list_runs(self) -> list[Run]:
        """Every run the link knows, oldest first."""

    @abstractmethod
    async def get_run(self, run_id: int) -> Run:
        """One run, or ``RunNotFoundError``."""

    @abstractmethod
    async def stop_run(self, run_id: int) -> Run:
        """Stop a run that has not finished (``finished:stopped``).

        A finished run is returned as it is.
        """

    @abstractmethod
    def logs(self, run_id: int, *, after: int = 0, follow: bool = False) -> AsyncIterator[LogLine]:
        """The run's log lines numbered above ``after``, in order.

        Without ``follow`` the iteration ends with the last line stored now; with it,
        it waits for new lines (by event, not by polling) and ends once the run has
        finished and every line is out. ``RunNotFoundError`` for an unknown run,
        raised on the first step.
        """

    @abstractmethod
    def metrics(
        self, run_id: int, *, after: int = 0, follow: bool = False
    ) -> AsyncIterator[MetricsLine]:
        """The run's metrics lines numbered above ``after``, in order, as :meth:`logs` gives
        its log lines (``follow`` alike): the ServerApp's header, then a line per round."""

    @abstractmethod
    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        """The run's artifact ``name`` (its final model: ``model``).

        ``NotFoundError`` when the run keeps none by that name; ``RunNotFoundError`` for
        an unknown run.
        """

    @abstractmethod
    async def list_nodes(self) -> list[NodeInfo]:
        """The nodes online now."""

    @abstractmethod
    async def authorized_nodes(self) -> list[str]:
        """The public keys of the nodes the link admits, one OpenSSH line each.

        ``UsageError`` when the link keeps no list (it admits any key).
        """

    @abstractmethod
    async def authorize_node(self, public_key: str) -> list[str]:
        """Admit the node of ``public_key`` (OpenSSH or PEM form) from now on; the list after.

        The link's authorized-nodes file is rewritten with it. ``UsageError`` for text
        that is not an accepted key, or when the link keeps no list.
        """

    @abstractmethod
    async def deauthorize_node(self, public_key: str) -> list[str]:
        """Refuse the node of ``public_key`` from its next request on; the list after.

        ``UsageError`` as :meth:`authorize_node`; a key not listed is no error.
        """

    @abstractmethod
    async def health(self) -> Health:
        """The link is up and answering; a summary of what it holds."""
