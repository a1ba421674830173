"""Claim pending runs and launch a ServerApp process for each; report how they end.

Theory of operation. The launcher asks its :class:`~fedcore.transport.exec.ExecService`
for pending runs — a long poll that the link answers as soon as a run is pending —
and claims as many as it has free slots. It runs inside the link over
:class:`~fedcore.roles.link.exec.LinkExec`, or in a process of its own over the exec
API (``fedcore serve --role exec``); either way it decides the same. A claim is
exclusive and fenced (R5, docs/reliability.md): every report the launcher makes for the run
carries the claim's token, and a stale one is refused, so an exec that lost its
claim (it stalled past the lease, and another exec took the run) can change nothing.

For each claimed run it fetches and unpacks the bundle into its cache (verified and
safe, see :mod:`fedcore.apps.bundle`), starts ``python -m fedcore.runtime.serverapp``
with the run id and the runtime API's address in the child's environment, and moves
the run to ``running``. The environment is a minimal one
(:func:`fedcore.apps.environment.app_environment`: nothing of the exec's secrets).
The claim's launch secret is in neither the environment nor the command line, which
other processes can read in ``/proc``: the child reads it from a pipe whose
descriptor it inherits, and whose only other end the launcher has written and closed.
With :attr:`LaunchSettings.app_user` the process runs as that user
(:mod:`.app_user`). From then on the ServerApp keeps its run
alive with its own heartbeats and ends it itself (``finished:completed`` or
``failed``). The launcher renews its claim every third of the lease throughout: a
renewal refused means the run finished or another exec has it. Those renewals also
vouch for the process, which the launcher holds: the ServerApp's own heartbeats run on
the app's event loop, which the app's code can block (a slow import, a long
synchronous step in ``main``), and the run must not fail for that while the process
lives.

The launcher watches the process: one that exits while its run is not finished has
crashed or was killed. With :attr:`LaunchSettings.max_restarts` (``--max-restarts``,
default 1) the launcher starts it again, up to that many times for the run, saying so
in the run's log with the last lines the process printed. It tells each process which
start it is (:data:`RESTART_ENV`) and whether it may be started again
(:data:`MAX_RESTARTS_ENV`): a ServerApp that may be keeps a round checkpoint on the link,
and one started again goes on from it (:mod:`fedcore.runtime.serverapp`); the nodes
keep their ClientApps' contexts meanwhile, since the run never ended. Once the
restarts are spent the run becomes ``finished:failed`` with the exit status and those
last lines. A run
stopped by an operator (or failed by the link) gets its process terminated, then
killed after a grace period, and the run's log a last line saying so; the
launcher hears of it by a long poll on the run. Leaving the launcher terminates the
processes it started, unless :attr:`LaunchSettings.leave_apps_running` (the link's, when
it is stopped: a Ctrl-C or SIGTERM of the link is a restart, not the end of its runs).
A process outlives a launcher that is killed (``kill -9`` of the link) or left that way:
it goes on through the runtime API and reconnects to the restarted link by itself —
the link keeps its runtime port across restarts (:mod:`fedcore.runtime.runtime_port`).
While the link cannot be reached, the launcher retries with backoff.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from fedcore.apps.bundle import bundle_dir, unpack_bundle
from fedcore.apps.environment import app_environment
from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.clock import Clock
from fedcore.defaults import CLAIM_LEASE, HEARTBEAT_INTERVAL, MAX_RESTARTS, MAX_RUNS
from fedcore.domain import Run
from fedcore.errors import (
    ClaimLostError,
    FedcoreError,
    LinkUnavailableError,
    StateError,
    first_error,
)
from fedcore.roles.exec.app_user import AppUser, remove_copy
from fedcore.state.base import RunClaim
from fedcore.transport.exec import ExecService
from fedcore.wire import MAX_VALUE_LEN

log = logging.getLogger(__name__)

T = TypeVar("T")

RUN_ID_ENV = "FEDCORE_RUN_ID"
SECRET_FD_ENV = "FEDCORE_RUN_SECRET_FD"
"""The number of the inherited descriptor the ServerApp reads its launch secret from."""
RUNTIME_ENV = "FEDCORE_RUNTIME_ADDRESS"
APP_DIR_ENV = "FEDCORE_APP_DIR"
HEARTBEAT_ENV = "FEDCORE_APP_HEARTBEAT"
RESTART_ENV = "FEDCORE_APP_RESTART"
"""Which start of the run's ServerApp process this is: 0, then 1 for the first restart…"""
MAX_RESTARTS_ENV = "FEDCORE_APP_MAX_RESTARTS"
"""``max_restarts``: a ServerApp that may be started again keeps round checkpoints."""
MAX_VALUE_ENV = "FEDCORE_APP_MAX_VALUE_BYTES"
"""``max_value_len``: the ServerApp pushes no longer str or bytes value, and decodes none."""
LAST_LINES = 20
"""Lines of a crashed ServerApp's output quoted in the run's log."""
LONGEST_LINE = 2000
"""Characters of each quoted line, at most: a process may print megabytes without a newline."""
RETRY_BACKOFF = BackoffPolicy(initial=0.5, maximum=10.0)
"""How an exec spaces the calls it retries while the link is unavailable."""


@dataclass(frozen=True)
class LaunchSettings:
    """How the launcher claims and launches.

    ``claim_lease``: seconds a claim lasts unless renewed (renewed every third of
    it). ``app_heartbeat``: the interval the ServerApp heartbeats at; the run fails
    after patience × that without one, unless this launcher, which holds the process,
    still renews its claim (a renewal vouches for the process: see
    :mod:`fedcore.state.base`). ``max_runs``: ServerApp processes at once.
    ``stop_grace``: seconds the process of a finished run gets to exit by itself
    (past the heartbeat that tells a stopped one),
    and then between terminating and killing it. ``poll_seconds``: the longest
    one wait for a run (or for a run's end) lasts before it is asked again — a long
    poll, over the network. ``command``: what starts a ServerApp process (tests put
    a stand-in here). ``app_env``: variables of the exec's environment passed to the
    ServerApps beside the allowed ones (``--app-env``). ``app_user``: the user they run
    as (None: the exec's own). ``max_restarts``: times a run's ServerApp process is
    started again after it crashed or was killed, before the run fails.
    ``max_value_len``: the most bytes one str or bytes value of a record may take in
    what the ServerApps push and decode (``--max-value-bytes``; the link's own cap).
    ``leave_apps_running``: leaving the launcher (its link stopped) leaves the ServerApp
    processes of runs in progress running, as a kill would, rather than ending them:
    they wait for the link (:data:`~fedcore.transport.grid.LINK_PATIENCE` a
    call) and go on with it when it is back.
    """

    claim_lease: float = CLAIM_LEASE
    app_heartbeat: float = HEARTBEAT_INTERVAL
    max_runs: int = MAX_RUNS
    stop_grace: float = 5.0
    poll_seconds: float = 30.0
    command: tuple[str, ...] = (sys.executable, "-m", "fedcore.runtime.serverapp")
    app_env: tuple[str, ...] = ()
    app_user: AppUser | None = None
    max_restarts: int = MAX_RESTARTS
    max_value_len: int = MAX_VALUE_LEN
    leave_apps_running: bool = False


class ServerAppLauncher:
    """Launches the ServerApps of the runs ``service`` hands out.

    The ServerApps reach the link at ``runtime_address``; when it is None, at the
    address the service gives for each launch (the link knows where it listens).
    """

    def __init__(
        self,
        service: ExecService,
        clock: Clock,
        *,
        work_dir: Path,
        settings: LaunchSettings | None = None,
        runtime_address: str | None = None,
    ) -> None:
        self._service = service
        self._clock = clock
        self._runtime_address = runtime_address
        self._work_dir = work_dir
        self._settings = settings or LaunchSettings()
        self._running = 0
        self._slot_freed: anyio.Event | None = None
        self.left_running: list[anyio.abc.Process] = []
        """The processes that leaving the launcher left running (``leave_apps_running``).

        Held for as long as the launcher is: an event loop may kill a child whose
        process object it collects (asyncio's transport does)."""

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim and launch until cancelled; every process started is ended on the way out."""
        settings = self._settings
        async with anyio.create_task_group() as launches:
            task_status.started()
            while True:
                free = settings.max_runs - self._running
                if free <= 0:
                    self._slot_freed = anyio.Event()
                    await self._slot_freed.wait()
                    continue
                claims = await self._patiently(
                    partial(
                        self._service.claim_runs,
                        limit=free,
                        lease=settings.claim_lease,
                        wait_seconds=settings.poll_seconds,
                    )
                )
                for claim in claims:
                    self._running += 1
                    launches.start_soon(self._launch, claim, name=f"run-{claim.run.run_id}")

    async def _launch(self, claim: RunClaim) -> None:
        run_id = claim.run.run_id
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._renew, claim)
                await self._run_process(claim, tasks.cancel_scope)
                tasks.cancel_scope.cancel()
        except* ClaimLostError:
            log.warning("run %d: the claim was lost; another exec has it or it ended", run_id)
        except* (FedcoreError, OSError) as failed:
            # OSError: the process could not be started (no such program, no memory,
            # no descriptors left); it fails this run, not the launcher and its link.
            error = first_error(failed)
            said = (
                str(error)
                if isinstance(error, FedcoreError)
                else f"{type(error).__name__}: {error}"
            )
            await self._fail(claim, f"could not launch the ServerApp: {said}")
        finally:
            self._running -= 1
            if self._slot_freed is not None:
                self._slot_freed.set()

    async def _patiently(self, call: Callable[[], Awaitable[T]]) -> T:
        return await patiently(self._clock, call)

    async def _renew(self, claim: RunClaim) -> None:
        """Keep the claim while the run starts and runs; a lost claim ends the launch."""
        run_id, lease = claim.run.run_id, self._settings.claim_lease
        while True:
            await self._clock.sleep(lease / 3)
            try:
                await self._service.renew_claim(run_id, claim.token, lease=lease)
            except LinkUnavailableError as exc:
                log.warning("run %d: the claim was not renewed this time: %s", run_id, exc)
            except ClaimLostError:
                if (await self._patiently(lambda: self._service.get_run(run_id))).status.finished:
                    return  # the run ended; the process watch takes it from here
                raise

    async def _app_dir(self, run: Run) -> Path:
        """The run's unpacked bundle: fetched only if not unpacked here already.

        Inside the link, submitting the run unpacked it into this very cache; a
        relaunch (a claim that ran out) finds it too.
        """
        cache = self._work_dir / "bundles"
        app_dir = bundle_dir(run.bundle_hash, cache)
        if await anyio.to_thread.run_sync(app_dir.is_dir):
            return app_dir
        bundle = await self._patiently(lambda: self._service.get_bundle(run.bundle_hash))
        return await anyio.to_thread.run_sync(unpack_bundle, bundle, run.bundle_hash, cache)

    def _leaves_running(self, launch: anyio.CancelScope) -> bool:
        """Whether a launch being cancelled leaves its process running: only when the
        launcher itself is left (not the launch's own scope, cancelled for a lost claim)
        and its settings say so."""
        return self._settings.leave_apps_running and not launch.cancel_called

    async def _run_process(self, claim: RunClaim, launch: anyio.CancelScope) -> None:
        """Run the claim's ServerApp process, starting it again as the settings allow.

        ``launch``: the scope of this launch alone (see :meth:`_leaves_running`)."""
        run = claim.run
        app_dir = await self._app_dir(run)
        runtime_address = self._runtime_address
        if runtime_address is None:
            runtime_address = await self._patiently(self._service.runtime_address)
        user = self._settings.app_user
        if user is not None:
            app_dir = await anyio.to_thread.run_sync(user.private_copy, app_dir)
        left_running = False
        try:
            for restart in range(self._settings.max_restarts + 1):
                output_path = self._output_path(claim, restart)
                code = await self._run_once(
                    claim, app_dir, runtime_address, output_path, restart, launch
                )
                if not await self._restart_after(claim, code, output_path, restart):
                    return
        except anyio.get_cancelled_exc_class():
            left_running = self._leaves_running(launch)
            raise
        finally:
            if user is not None and not left_running:  # a process left running reads it
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(remove_copy, app_dir)

    def _output_path(self, claim: RunClaim, restart: int) -> Path:
        """Where the process of this launch writes its output (one file per process)."""
        suffix = f"-restart{restart}" if restart else ""
        path = self._work_dir / "runs" / f"{claim.run.run_id}-{claim.attempt}{suffix}.out"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    async def _run_once(
        self,
        claim: RunClaim,
        app_dir: Path,
        runtime_address: str,
        output_path: Path,
        restart: int,
        launch: anyio.CancelScope,
    ) -> int:
        """Start the run's ServerApp process and wait for it to exit; its exit status.

        Cancelled, it ends the process, unless :meth:`_leaves_running` says otherwise."""
        run = claim.run
        process = await self._start_process(claim, app_dir, runtime_address, output_path, restart)
        left_running = False
        try:
            if restart == 0:
                await self._patiently(
                    lambda: self._service.start_run(
                        run.run_id, claim.token, heartbeat_interval=self._settings.app_heartbeat
                    )
                )
            started = f"[exec] ServerApp process {process.pid} started (attempt {claim.attempt}"
            started += f", restart {restart})" if restart else ")"
            await self._patiently(lambda: self._service.append_logs(run.run_id, [started]))
            return await self._watch(run.run_id, process)
        except anyio.get_cancelled_exc_class():
            left_running = self._leaves_running(launch)
            raise
        finally:
            if left_running:
                self.left_running.append(process)
                log.info(
                    "run %d: ServerApp process %d left running; it goes on with the link "
                    "when the link is back",
                    run.run_id,
                    process.pid,
                )
            else:
                with anyio.CancelScope(shield=True):
                    await self._end(process)

    async def _restart_after(
        self, claim: RunClaim, code: int, output_path: Path, restart: int
    ) -> bool:
        """Whether to start the process again, now that it exited with ``code``.

        Only a process whose run goes on is started again, while restarts are left;
        otherwise the exit is reported as the run's end.
        """
        run_id = claim.run.run_id
        left = self._settings.max_restarts - restart
        run = await self._patiently(lambda: self._service.get_run(run_id))
        if run.status.finished or left <= 0:
            await self._report_exit(claim, code, output_path, run, restarts=restart)
            return False
        reason = f"the ServerApp process {_describe(code)}"
        log.warning("run %d: %s; starting it again (%d restart(s) left)", run_id, reason, left - 1)
        tail = await anyio.to_thread.run_sync(_last_lines, output_path)
        lines = [f"[exec] {reason}; its last output:", *tail] if tail else []
        lines.append(
            f"[exec] starting the ServerApp again "
            f"(restart {restart + 1} of {self._settings.max_restarts})"
        )
        await self._patiently(lambda: self._service.append_logs(run_id, lines))
        return True

    async def _start_process(
        self,
        claim: RunClaim,
        app_dir: Path,
        runtime_address: str,
        output_path: Path,
        restart: int,
    ) -> anyio.abc.Process:
        """Start the ServerApp of ``claim``, its launch secret waiting in a pipe for it."""
        run, settings = claim.run, self._settings
        user = settings.app_user
        environment = {
            **app_environment(os.environ, settings.app_env),
            **(user.environment() if user is not None else {}),
            RUN_ID_ENV: str(run.run_id),
            RUNTIME_ENV: runtime_address,
            APP_DIR_ENV: str(app_dir),
            HEARTBEAT_ENV: repr(settings.app_heartbeat),
            RESTART_ENV: str(restart),
            MAX_RESTARTS_ENV: str(settings.max_restarts),
            MAX_VALUE_ENV: str(settings.max_value_len),
        }
        if user is not None:
            environment["TMPDIR"] = str(app_dir.parent)
        secret_fd = _secret_pipe(claim.secret)
        environment[SECRET_FD_ENV] = str(secret_fd)
        try:
            with output_path.open("wb") as output:
                command = list(settings.command)
                process = await anyio.open_process(
                    user.command(command) if user is not None else command,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    pass_fds=(secret_fd,),
                    start_new_session=True,  # a Ctrl-C at the link's terminal is the link's
                    cwd=app_dir.parent if user is not None else None,
                )
        finally:
            os.close(secret_fd)
        # Beside its output, for operators (and tests) who must find a process that
        # outlived its link.
        output_path.with_suffix(".pid").write_text(f"{process.pid}\n")
        log.info(
            "run %d: ServerApp process %d started (attempt %d)",
            run.run_id,
            process.pid,
            claim.attempt,
        )
        return process

    async def _watch(self, run_id: int, process: anyio.abc.Process) -> int:
        """Wait for the process to exit; terminate it if its run finishes first."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._stop_when_finished, run_id, process)
            code = await process.wait()
            tasks.cancel_scope.cancel()
        return code

    async def _stop_when_finished(self, run_id: int, process: anyio.abc.Process) -> None:
        poll = self._settings.poll_seconds
        finished = False
        while not finished:
            run = await self._patiently(
                lambda: self._service.wait_finished(run_id, wait_seconds=poll)
            )
            finished = run.status.finished
        # A ServerApp that finished its run itself is on its way out (shipping its last
        # log lines); one that was stopped learns it from its next heartbeat, up to an
        # interval away. Either way it gets that and the grace period to exit by itself
        # before it is terminated.
        settings = self._settings
        with self._clock.move_on_after(settings.app_heartbeat + settings.stop_grace):
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

    async def _report_exit(
        self, claim: RunClaim, code: int, output_path: Path, run: Run, *, restarts: int
    ) -> None:
        run_id = claim.run.run_id
        if run.status.finished:
            log.info("run %d: ServerApp exited (%s); run %s", run_id, _describe(code), run.status)
            if code < 0:  # ended here, before its own last words: the log still says how
                line = (
                    f"[exec] run {run_id} is {run.status}: its ServerApp process {_describe(code)}"
                )
                await self._patiently(lambda: self._service.append_logs(run_id, [line]))
            return
        tail = await anyio.to_thread.run_sync(_last_lines, output_path)
        reason = f"the ServerApp process {_describe(code)}"
        if restarts:
            reason += f" (after {restarts} restart{'s' if restarts > 1 else ''})"
        if tail:
            lines = [f"[exec] {reason}; its last output:", *tail]
            await self._patiently(lambda: self._service.append_logs(run_id, lines))
        await self._fail(claim, reason)

    async def _fail(self, claim: RunClaim, reason: str) -> None:
        run_id = claim.run.run_id
        log.warning("run %d failed: %s", run_id, reason)
        try:
            await self._patiently(lambda: self._service.fail_run(run_id, claim.token, reason))
        except StateError as exc:  # finished meanwhile, or the claim moved on
            log.info("run %d: not marked failed (%s)", run_id, exc)


def _secret_pipe(secret: str) -> int:
    """The read end of a pipe holding ``secret``, its write end closed (the reader sees
    end-of-file after the secret). A secret is far under a pipe's buffer: the write
    never blocks."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, secret.encode())
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


async def patiently(
    clock: Clock,
    call: Callable[[], Awaitable[T]],
    *,
    note: Callable[[LinkUnavailableError, float], None] | None = None,
) -> T:
    """``call()``, made again after a backoff each time the link is unavailable.

    ``note(exc, delay)`` hears of each retry; by default it is logged as a warning.
    """
    backoff = Backoff(clock, RETRY_BACKOFF, random.Random())
    while True:
        try:
            return await call()
        except LinkUnavailableError as exc:
            delay = backoff.next_delay()
            if note is None:
                log.warning("%s; trying again in %.2g s", exc, delay)
            else:
                note(exc, delay)
        await clock.sleep(delay)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _last_lines(path: Path) -> list[str]:
    """The last lines of the file, each cut to :data:`LONGEST_LINE` characters.

    Only the file's end is read: its output may be far larger than what is quoted.
    """
    try:
        with path.open("rb") as file:
            start = max(0, file.seek(0, os.SEEK_END) - LAST_LINES * (LONGEST_LINE + 1))
            file.seek(start)
            lines = file.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    if start > 0 and len(lines) > 1:
        lines = lines[1:]  # the first began before the part read
    return [line[:LONGEST_LINE] for line in lines[-LAST_LINES:]]
