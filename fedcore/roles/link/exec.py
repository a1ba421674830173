"""The link's side of the exec API: claims, launches and reports, over the LinkState.

:class:`LinkExec` implements :class:`~fedcore.transport.exec.ExecService` over the
LinkState, for the launcher inside the link process and, behind
:mod:`fedcore.transport.http.exec`, for execs started on their own. Both waits
(``claim_runs`` with ``wait_seconds`` and ``wait_finished``) sleep on the state's run
notifications and look again only when a run changed, each until its wait runs out.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedcore.clock import Clock
from fedcore.domain import Run, RunStatus
from fedcore.state.base import LinkState, RunClaim
from fedcore.state.waiting import look_until
from fedcore.transport.exec import ExecService


class LinkExec(ExecService):
    """The exec API over ``state``; ServerApps reach the link at ``runtime_address``."""

    def __init__(self, state: LinkState, clock: Clock, *, runtime_address: str) -> None:
        self._state = state
        self._clock = clock
        self._runtime_address = runtime_address

    async def runtime_address(self) -> str:
        return self._runtime_address

    async def claim_runs(
        self, *, limit: int, lease: float, wait_seconds: float = 0.0
    ) -> list[RunClaim]:
        async def claim() -> list[RunClaim]:
            return await self._state.claim_runs(limit=limit, lease=lease)

        return await look_until(self._clock, self._state.watch_runs, claim, bool, wait_seconds)

    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        return await self._state.renew_claim(run_id, token, lease=lease)

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        return await self._state.start_run(run_id, token, heartbeat_interval=heartbeat_interval)

    async def fail_run(self, run_id: int, token: int, reason: str) -> Run:
        return await self._state.update_run_status(run_id, RunStatus.FAILED, reason, token=token)

    async def get_run(self, run_id: int) -> Run:
        return await self._state.get_run(run_id)

    async def wait_finished(self, run_id: int, *, wait_seconds: float) -> Run:
        async def look() -> Run:
            return await self._state.get_run(run_id)

        return await look_until(
            self._clock,
            self._state.watch_runs,
            look,
            lambda run: run.status.finished,
            wait_seconds,
            relevant=lambda changed: changed == run_id,
        )

    async def get_bundle(self, bundle_hash: str) -> bytes:
        return await self._state.get_bundle(bundle_hash)

    async def append_logs(self, run_id: int, lines: Sequence[str]) -> None:
        await self._state.append_logs(run_id, lines)
