"""The link's side of the exec API: claims, launches and reports, over the LinkState.

:class:`LinkExec` implements :class:`~fedcore.transport.exec.ExecService` over the
LinkState, for the launcher inside the link process and, behind
:mod:`fedcore.transport.http.exec`, for execs started on their own. Both waits
(``claim_runs`` with ``wait_seconds`` and ``wait_finished``) sleep on the state's run
notifications and look again only when a run changed, each until its wait runs out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from fedcore.clock import Clock
from fedcore.domain import Run, RunStatus
from fedcore.state.base import LinkState, RunClaim
from fedcore.transport.exec import ExecService

T = TypeVar("T")


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

        return await self._until(claim, bool, None, wait_seconds)

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

        return await self._until(look, lambda run: run.status.finished, run_id, wait_seconds)

    async def get_bundle(self, bundle_hash: str) -> bytes:
        return await self._state.get_bundle(bundle_hash)

    async def append_logs(self, run_id: int, lines: Sequence[str]) -> None:
        await self._state.append_logs(run_id, lines)

    async def _until(
        self,
        look: Callable[[], Awaitable[T]],
        done: Callable[[T], bool],
        run_id: int | None,
        wait_seconds: float,
    ) -> T:
        """``look()`` again after each change of ``run_id`` (of any run: None) until it is done.

        Returns the last result when ``wait_seconds`` pass first. Subscribing before
        the first look means that no change between a look and the wait goes unheard.
        """
        if not wait_seconds >= 0:
            raise ValueError(f"wait_seconds must not be negative, got {wait_seconds}")
        changed = anyio.Event()

        def wake(changed_id: int) -> None:
            if run_id is None or changed_id == run_id:
                changed.set()

        deadline = self._clock.now() + wait_seconds
        with self._state.watch_runs(wake):
            while not done(result := await look()):
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    break
                with self._clock.move_on_after(remaining):
                    await changed.wait()
                changed = anyio.Event()
        return result
