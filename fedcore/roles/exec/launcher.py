"""Claim pending runs and launch a ServerApp process for each; report how they end.

Theory of operation. The launcher sleeps until the LinkState announces a run
(``watch_runs``), then claims as many pending runs as it has free slots. A claim is
exclusive and fenced (DESIGN.md R5): every report the launcher makes for the run
carries the claim's token, and a stale one is refused, so an exec that lost its
claim (it stalled past the lease, and another exec took the run) can change nothing.

For each claimed run it unpacks the bundle into its cache (verified and safe, see
:mod:`fedcore.apps.bundle`), starts ``python -m fedcore.runtime.serverapp`` with the
run id, the runtime API's address and the claim's launch secret in the child's
environment — never on its command line, where any local user could read it — and
moves the run to ``running``. From then on the ServerApp keeps its run alive with
its own heartbeats and ends it itself (``finished:completed`` or ``failed``).

The launcher watches the process: one that exits while its run is not finished has
crashed or was killed — the run becomes ``finished:failed`` with the exit status
and the last lines the process printed. A run stopped by an operator (or failed by
the link) gets its process terminated, then killed after a grace period. Leaving
the launcher terminates the processes it started. A process outlives a launcher
that is killed (``kill -9`` of the link): it goes on through the runtime API and
reconnects to the restarted link by itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from fedcore.apps.bundle import unpack_bundle
from fedcore.clock import Clock
from fedcore.domain import RunStatus
from fedcore.errors import ClaimLostError, FedcoreError, StateError
from fedcore.state.base import LinkState, RunClaim

log = logging.getLogger(__name__)

RUN_ID_ENV = "FEDCORE_RUN_ID"
SECRET_ENV = "FEDCORE_RUN_SECRET"
RUNTIME_ENV = "FEDCORE_RUNTIME_ADDRESS"
APP_DIR_ENV = "FEDCORE_APP_DIR"
HEARTBEAT_ENV = "FEDCORE_APP_HEARTBEAT"
LAST_LINES = 20
"""Lines of a crashed ServerApp's output quoted in the run's log."""


@dataclass(frozen=True)
class LaunchSettings:
    """How the launcher claims and launches.

    ``claim_lease``: seconds a claim lasts unless renewed (renewed every third of
    it while the run starts). ``app_heartbeat``: the interval the ServerApp
    heartbeats at; the run fails after patience × that without one.
    ``max_runs``: ServerApp processes at once. ``stop_grace``: seconds the
    process of a finished run gets to exit by itself, and then between terminating
    and killing it. ``command``: what starts a ServerApp process (tests put a
    stand-in here).
    """

    claim_lease: float = 10.0
    app_heartbeat: float = 2.0
    max_runs: int = 8
    stop_grace: float = 5.0
    command: tuple[str, ...] = (sys.executable, "-m", "fedcore.runtime.serverapp")


class ServerAppLauncher:
    """Launches the ServerApps of ``state``'s runs; they reach the link at ``runtime_address``."""

    def __init__(
        self,
        state: LinkState,
        clock: Clock,
        *,
        runtime_address: str,
        work_dir: Path,
        settings: LaunchSettings | None = None,
    ) -> None:
        self._state = state
        self._clock = clock
        self._runtime_address = runtime_address
        self._work_dir = work_dir
        self._settings = settings or LaunchSettings()
        self._running = 0

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim and launch until cancelled; every process started is ended on the way out."""
        wake = anyio.Event()

        def on_run(_: int) -> None:
            wake.set()

        with self._state.watch_runs(on_run):
            async with anyio.create_task_group() as launches:
                task_status.started()
                while True:
                    free = self._settings.max_runs - self._running
                    claims = []
                    if free > 0:
                        claims = await self._state.claim_runs(
                            limit=free, lease=self._settings.claim_lease
                        )
                    for claim in claims:
                        self._running += 1
                        launches.start_soon(self._launch, claim, name=f"run-{claim.run.run_id}")
                    if not claims:
                        await wake.wait()
                        wake = anyio.Event()

    async def _launch(self, claim: RunClaim) -> None:
        run_id = claim.run.run_id
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._renew, claim)
                await self._run_process(claim)
                tasks.cancel_scope.cancel()
        except ClaimLostError:
            log.warning("run %d: the claim was lost; another exec has it or it ended", run_id)
        except FedcoreError as exc:
            await self._fail(claim, f"could not launch the ServerApp: {exc}")
        finally:
            self._running -= 1

    async def _renew(self, claim: RunClaim) -> None:
        """Keep the claim while the run starts and runs; a lost claim ends the launch."""
        lease = self._settings.claim_lease
        while True:
            await self._clock.sleep(lease / 3)
            try:
                await self._state.renew_claim(claim.run.run_id, claim.token, lease=lease)
            except ClaimLostError:
                if (await self._state.get_run(claim.run.run_id)).status.finished:
                    return  # the run ended; the process watch takes it from here
                raise

    async def _run_process(self, claim: RunClaim) -> None:
        run = claim.run
        bundle = await self._state.get_bundle(run.bundle_hash)
        app_dir = await anyio.to_thread.run_sync(
            unpack_bundle, bundle, run.bundle_hash, self._work_dir / "bundles"
        )
        output_path = self._work_dir / "runs" / f"{run.run_id}-{claim.attempt}.out"
        output_path.parent.mkdir(parents=True, exist_ok=True)
        environment = {
            **os.environ,
            RUN_ID_ENV: str(run.run_id),
            SECRET_ENV: claim.secret,
            RUNTIME_ENV: self._runtime_address,
            APP_DIR_ENV: str(app_dir),
            HEARTBEAT_ENV: repr(self._settings.app_heartbeat),
        }
        with output_path.open("wb") as output:
            process = await anyio.open_process(
                list(self._settings.command),
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the link's terminal is the link's
            )
        # Beside its output, for operators (and tests) who must find a process that
        # outlived its link.
        output_path.with_suffix(".pid").write_text(f"{process.pid}\n")
        log.info(
            "run %d: ServerApp process %d started (attempt %d)",
            run.run_id,
            process.pid,
            claim.attempt,
        )
        try:
            await self._state.start_run(
                run.run_id, claim.token, heartbeat_interval=self._settings.app_heartbeat
            )
            code = await self._watch(run.run_id, process)
        finally:
            with anyio.CancelScope(shield=True):
                await self._end(process)
        await self._report_exit(claim, code, output_path)

    async def _watch(self, run_id: int, process: anyio.abc.Process) -> int:
        """Wait for the process to exit; terminate it if its run finishes first."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._stop_when_finished, run_id, process)
            code = await process.wait()
            tasks.cancel_scope.cancel()
        return code

    async def _stop_when_finished(self, run_id: int, process: anyio.abc.Process) -> None:
        changed = anyio.Event()

        def on_run(changed_id: int) -> None:
            if changed_id == run_id:
                changed.set()

        with self._state.watch_runs(on_run):
            while not (await self._state.get_run(run_id)).status.finished:
                await changed.wait()
                changed = anyio.Event()
        # A ServerApp that finished its run itself is on its way out (shipping its last
        # log lines); one that was stopped learns it from its next heartbeat. Either way
        # it gets the grace period to exit by itself before it is terminated.
        with self._clock.move_on_after(self._settings.stop_grace):
            await process.wait()
        await self._end(process)

    async def _end(self, process: anyio.abc.Process) -> None:
        """Terminate the process if it still runs, and kill it after the grace period."""
        if process.returncode is not None:
            return
        try:
            process.terminate()
        except ProcessLookupError:
            return
        with self._clock.move_on_after(self._settings.stop_grace):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()

    async def _report_exit(self, claim: RunClaim, code: int, output_path: Path) -> None:
        run = await self._state.get_run(claim.run.run_id)
        if run.status.finished:
            log.info(
                "run %d: ServerApp exited (%s); run %s", run.run_id, _describe(code), run.status
            )
            return
        tail = await anyio.to_thread.run_sync(_last_lines, output_path)
        reason = f"the ServerApp process {_describe(code)}"
        if tail:
            await self._state.append_logs(run.run_id, [f"[exec] {reason}; its last output:", *tail])
        await self._fail(claim, reason)

    async def _fail(self, claim: RunClaim, reason: str) -> None:
        log.warning("run %d failed: %s", claim.run.run_id, reason)
        try:
            await self._state.update_run_status(
                claim.run.run_id, RunStatus.FAILED, reason, token=claim.token
            )
        except StateError as exc:  # finished meanwhile, or the claim moved on
            log.info("run %d: not marked failed (%s)", claim.run.run_id, exc)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _last_lines(path: Path) -> list[str]:
    try:
        with path.open("rb") as file:
            lines = deque(file, maxlen=LAST_LINES)
    except OSError:
        return []
    return [line.decode("utf-8", "replace").rstrip("\n") for line in lines]
