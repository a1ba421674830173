"""The exec API in domain terms: what a ServerApp launcher asks of the link.

An exec claims pending runs, fetches their bundles, launches one ServerApp process
per run and reports how it ends (:mod:`fedcore.roles.exec.launcher`). Inside the
link it calls the LinkState through :class:`~fedcore.roles.link.exec.LinkExec`;
started on its own (``fedcore serve --role exec``, for process isolation) it calls
the same service over HTTP (:mod:`fedcore.transport.http.exec`), authenticated by a
secret it shares with the link. The launcher is written against this interface only.

A claim (:class:`~fedcore.state.base.RunClaim`) is exclusive and fenced (R5 in
docs/reliability.md): the calls an exec makes as the run's claimant carry the claim's
token and raise :class:`~fedcore.errors.ClaimLostError` once the token is stale — another
exec claimed the run after this claim ran out, or the run finished. Waits happen in
the service and are woken by the link's run events, never by polling, so a remote
exec learns of a new run or of a stopped one within a round trip. A remote
implementation raises the same errors, plus
:class:`~fedcore.errors.LinkUnavailableError` while the link cannot be reached.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from fedcore.domain import Run
from fedcore.state.base import RunClaim

__all__ = ["ExecService", "RunClaim"]


class ExecService(ABC):
    """The link's side of the exec API."""

    @abstractmethod
    async def runtime_address(self) -> str:
        """``HOST:PORT`` of the runtime API, where the ServerApps launched reach the link."""

    @abstractmethod
    async def claim_runs(
        self, *, limit: int, lease: float, wait_seconds: float = 0.0
    ) -> list[RunClaim]:
        """Claim up to ``limit`` pending runs, oldest first; each claim lasts ``lease`` s.

        With no run pending, waits up to ``wait_seconds`` for one and claims it then;
        an empty list when the wait ends without one. A negative ``limit`` or a
        ``lease`` that is not positive raises ``ValueError``.
        """

    @abstractmethod
    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        """Extend the claim ``lease`` seconds from now; return its new expiry.

        ``ClaimLostError`` once ``token`` is not the run's claim any more — which is
        also how an exec learns that the run finished.
        """

    @abstractmethod
    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        """The ServerApp process runs: ``starting → running``; its heartbeats keep the run alive.

        Repeating the call with the same token (a retry after a lost answer) returns
        the run unchanged. ``ClaimLostError`` for a stale token.
        """

    @abstractmethod
    async def fail_run(self, run_id: int, token: int, reason: str) -> Run:
        """The claimant's ServerApp could not start or died: ``finished:failed`` with ``reason``.

        ``ClaimLostError`` for a stale token — the run finished meanwhile, or another
        exec holds it now — and then nothing changes.
        """

    @abstractmethod
    async def get_run(self, run_id: int) -> Run:
        """The run as it is now, or ``RunNotFoundError``."""

    @abstractmethod
    async def wait_finished(self, run_id: int, *, wait_seconds: float) -> Run:
        """The run once it has finished, or as it is when ``wait_seconds`` pass first."""

    @abstractmethod
    async def get_bundle(self, bundle_hash: str) -> bytes:
        """The app bundle stored under ``bundle_hash``, or ``NotFoundError``."""

    @abstractmethod
    async def append_logs(self, run_id: int, lines: Sequence[str]) -> None:
        """Add lines to the run's log (what the exec has to say about its ServerApp)."""
