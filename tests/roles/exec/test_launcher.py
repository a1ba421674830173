"""The ServerApp launcher: claims, launches with the secret in a pipe, reports exits.

A stand-in command plays the ServerApp process (a few lines of Python), so these
tests exercise the launcher's decisions without the runtime API.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fedcore.apps.bundle import pack_bundle
from fedcore.domain import Run, RunStatus
from fedcore.errors import LinkUnavailableError, UsageError
from fedcore.roles.exec.app_user import AppUser
from fedcore.roles.exec.launcher import (
    MAX_RESTARTS_ENV,
    RESTART_ENV,
    LaunchSettings,
    ServerAppLauncher,
)
from fedcore.roles.link.exec import LinkExec
from fedcore.state.base import RunClaim
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock

pytestmark = pytest.mark.anyio


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


async def _submit(state: InMemoryLinkState, tmp_path: Path) -> Run:
    app = tmp_path / "app"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text('[tool.fedcore.app]\nserver = "a:s"\nclient = "a:c"\n')
    bundle = pack_bundle(app)
    await state.put_bundle(bundle.data)
    return await state.create_run({}, bundle_hash=bundle.sha256)


def _launcher(
    state: InMemoryLinkState, clock: FakeClock, tmp_path: Path, script: str, **settings: float
) -> ServerAppLauncher:
    command = (sys.executable, "-c", script)
    return ServerAppLauncher(
        LinkExec(state, clock, runtime_address="127.0.0.1:1"),
        clock,
        work_dir=tmp_path / "work",
        settings=LaunchSettings(command=command, **settings),  # type: ignore[arg-type]
    )


async def _until(state: InMemoryLinkState, run_id: int, statuses: set[RunStatus]) -> Run:
    """Wait (by event, with a real-time deadline) until the run has one of ``statuses``."""
    changed = anyio.Event()

    def wake(_: int) -> None:
        changed.set()

    with anyio.fail_after(20), state.watch_runs(wake):
        while (run := await state.get_run(run_id)).status not in statuses:
            await changed.wait()
            changed = anyio.Event()
    return run


async def test_a_crashed_serverapp_fails_its_run_with_its_last_words(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    script = (
        "import os, sys\n"
        "secret = os.read(int(os.environ['FEDCORE_RUN_SECRET_FD']), 4096)\n"
        "print('a secret' if len(secret) >= 32 else 'no secret')\n"
        "shown = [p for p in ('cmdline', 'environ')\n"
        "         if secret in open(f'/proc/self/{p}', 'rb').read()]\n"
        "print('secret shown in', shown)\n"
        "app = os.path.isdir(os.environ['FEDCORE_APP_DIR'])\n"
        "print('run', os.environ['FEDCORE_RUN_ID'], 'app', app)\n"
        "sys.exit(3)\n"
    )
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        launcher = _launcher(state, fake_clock, tmp_path, script, max_restarts=0)
        await tasks.start(launcher.serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert failed.reason == "the ServerApp process exited with status 3"
    lines = [line.text for line in await state.get_logs(run.run_id)]
    assert "a secret" in lines
    assert "secret shown in []" in lines
    assert f"run {run.run_id} app True" in lines


def _launch_counting(launches: Path, then: str) -> str:
    """A ServerApp stand-in that numbers its launches in ``launches``: the first kills
    itself (as the OOM killer would), the others run ``then``."""
    return (
        "import os, signal, sys\n"
        f"path = {str(launches)!r}\n"
        "n = len(open(path).readlines()) if os.path.exists(path) else 0\n"
        "open(path, 'a').write('launch\\n')\n"
        "print('launch', n, flush=True)\n"
        "if n == 0:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"{then}\n"
    )


async def test_a_killed_serverapp_is_started_again_and_the_run_fails_once_restarts_are_spent(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    launches = tmp_path / "launches"
    script = _launch_counting(launches, "sys.exit(4)")
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        launcher = _launcher(state, fake_clock, tmp_path, script, max_restarts=1)
        await tasks.start(launcher.serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert launches.read_text() == "launch\n" * 2
    assert failed.reason == "the ServerApp process exited with status 4 (after 1 restart)"
    lines = [line.text for line in await state.get_logs(run.run_id)]
    restarted = [
        "[exec] the ServerApp process was killed by SIGKILL; its last output:",
        "launch 0",
        "[exec] starting the ServerApp again (restart 1 of 1)",
    ]
    start = lines.index(restarted[0])
    assert lines[start : start + 3] == restarted
    assert "launch 1" in lines[start + 3 :]
    assert any(line.endswith("(attempt 1, restart 1)") for line in lines[start + 3 :])
    assert (tmp_path / "work" / "runs" / f"{run.run_id}-1-restart1.pid").is_file()


async def test_by_default_a_killed_serverapp_is_started_once_more_and_told_so(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    launches = tmp_path / "launches"
    told = tmp_path / "told"
    script = _launch_counting(
        launches,
        f"open({str(told)!r}, 'a').write(os.environ[{RESTART_ENV!r}] + ' of ' "
        f"+ os.environ[{MAX_RESTARTS_ENV!r}] + '\\n')\n"
        "os.kill(os.getpid(), signal.SIGKILL)",
    )
    run = await _submit(state, tmp_path)
    assert LaunchSettings().max_restarts == 1
    async with anyio.create_task_group() as tasks:
        await tasks.start(_launcher(state, fake_clock, tmp_path, script).serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert launches.read_text() == "launch\nlaunch\n"
    assert told.read_text() == "1 of 1\n"  # the second start knows it is one: it resumes
    assert failed.reason == "the ServerApp process was killed by SIGKILL (after 1 restart)"


async def test_with_no_restarts_a_killed_serverapp_fails_its_run_at_once(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    launches = tmp_path / "launches"
    script = _launch_counting(launches, "sys.exit(4)")
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        launcher = _launcher(state, fake_clock, tmp_path, script, max_restarts=0)
        await tasks.start(launcher.serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert launches.read_text() == "launch\n"
    assert failed.reason == "the ServerApp process was killed by SIGKILL"


async def _until_logged(state: InMemoryLinkState, run_id: int, ending: str) -> list[str]:
    """Wait (by event, with a real-time deadline) for a log line ending with ``ending``."""
    appended = anyio.Event()
    with anyio.fail_after(20), state.watch_logs(run_id, lambda _: appended.set()):
        while True:
            lines = [line.text for line in await state.get_logs(run_id)]
            if any(line.endswith(ending) for line in lines):
                return lines
            await appended.wait()
            appended = anyio.Event()


async def test_a_restarted_serverapp_whose_run_ends_is_not_started_again(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """The run finishes under the second process (the test finishes it for the stand-in):
    that process is ended as any of a finished run, and not started again, restarts left."""
    script = _launch_counting(tmp_path / "launches", "import time; time.sleep(60)")
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        launcher = _launcher(state, fake_clock, tmp_path, script, max_restarts=3)
        await tasks.start(launcher.serve)
        await _until_logged(state, run.run_id, "(attempt 1, restart 1)")
        await state.update_run_status(run.run_id, RunStatus.COMPLETED, "")
        await anyio.wait_all_tasks_blocked()
        settings = LaunchSettings()
        fake_clock.advance(settings.app_heartbeat + settings.stop_grace + 0.1)
        lines = await _until_logged(
            state, run.run_id, "its ServerApp process was killed by SIGTERM"
        )
        tasks.cancel_scope.cancel()
    assert not any("restart 2" in line for line in lines)
    assert (await state.get_run(run.run_id)).status is RunStatus.COMPLETED


async def test_a_stopped_run_has_its_process_terminated(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        await tasks.start(
            _launcher(state, fake_clock, tmp_path, "import time; time.sleep(60)").serve
        )
        await _until(state, run.run_id, {RunStatus.RUNNING})
        # The launcher writes the pid file before it moves the run to running.
        pid_file = anyio.Path(tmp_path / "work" / "runs" / f"{run.run_id}-1.pid")
        exited = os.pidfd_open(int(await pid_file.read_text()))
        try:
            await state.update_run_status(run.run_id, RunStatus.STOPPED, "operator")
            await anyio.wait_all_tasks_blocked()
            # A heartbeat to hear of the stop and the grace to exit by itself; then it is
            # terminated.
            settings = LaunchSettings()
            fake_clock.advance(settings.app_heartbeat + settings.stop_grace + 0.1)
            with anyio.fail_after(20):
                await anyio.wait_readable(exited)  # a pidfd turns readable when its process ends
        finally:
            os.close(exited)
        # Terminated before it could say so itself: the exec ends the log on the stop.
        last = f"[exec] run {run.run_id} is finished:stopped: its ServerApp process was killed"
        appended = anyio.Event()
        with anyio.fail_after(20), state.watch_logs(run.run_id, lambda _: appended.set()):
            while not (await state.get_logs(run.run_id))[-1].text.startswith(last):
                await appended.wait()
                appended = anyio.Event()
        tasks.cancel_scope.cancel()
    assert (await state.get_run(run.run_id)).reason == "operator"


@pytest.mark.parametrize("leave", [False, True])
async def test_leaving_the_launcher_ends_its_processes_unless_told_to_leave_them_running(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path, leave: bool
) -> None:
    """A link stopped by its operator leaves its runs' processes running (``leave``): they
    go on when it is back, as after a kill; the run is not touched either way."""
    run = await _submit(state, tmp_path)
    script = "import time; time.sleep(60)"
    launcher = _launcher(state, fake_clock, tmp_path, script, leave_apps_running=leave)
    async with anyio.create_task_group() as tasks:
        await tasks.start(launcher.serve)
        await _until(state, run.run_id, {RunStatus.RUNNING})
        pid = int((tmp_path / "work" / "runs" / f"{run.run_id}-1.pid").read_text())
        exited = os.pidfd_open(pid)
        tasks.cancel_scope.cancel()
    try:
        # A pidfd is readable once its process has exited.
        assert bool(select.select([exited], [], [], 0)[0]) is not leave
    finally:
        os.close(exited)
    assert [process.pid for process in launcher.left_running] == ([pid] if leave else [])
    for process in launcher.left_running:
        process.kill()
        await process.wait()
    assert (await state.get_run(run.run_id)).status is RunStatus.RUNNING


async def test_a_claim_left_by_a_dead_exec_expires_and_the_run_launches_once_more(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    run = await _submit(state, tmp_path)
    (dead,) = await state.claim_runs(limit=1, lease=5.0)  # an exec that dies right after
    script = "import sys; print('attempt'); sys.exit(4)"
    async with anyio.create_task_group() as tasks:
        launcher = _launcher(state, fake_clock, tmp_path, script, max_restarts=0)
        await tasks.start(launcher.serve)
        await anyio.wait_all_tasks_blocked()
        assert (await state.get_run(run.run_id)).status is RunStatus.STARTING
        fake_clock.advance(5.1)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert failed.reason == "the ServerApp process exited with status 4"
    attempts = [line.text for line in await state.get_logs(run.run_id) if line.text == "attempt"]
    assert attempts == ["attempt"]
    assert (tmp_path / "work" / "runs" / f"{run.run_id}-2.out").exists()
    assert dead.attempt == 1


class FlakyExec(LinkExec):
    """A LinkExec whose first calls fail as if the link were away (restarting)."""

    def __init__(self, state: InMemoryLinkState, clock: FakeClock, **failures: int) -> None:
        super().__init__(state, clock, runtime_address="127.0.0.1:7")
        self.failures = failures
        """How many more times each method fails."""
        self.refused: list[str] = []

    def _away(self, name: str) -> None:
        if self.failures.get(name, 0) > 0:
            self.failures[name] -= 1
            self.refused.append(name)
            raise LinkUnavailableError("the link at 127.0.0.1:1 is unavailable (fake)")

    async def claim_runs(
        self, *, limit: int, lease: float, wait_seconds: float = 0.0
    ) -> list[RunClaim]:
        self._away("claim_runs")
        return await super().claim_runs(limit=limit, lease=lease, wait_seconds=wait_seconds)

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        self._away("start_run")
        return await super().start_run(run_id, token, heartbeat_interval=heartbeat_interval)


async def test_the_runtime_address_is_the_links_unless_given_and_the_launch_is_logged(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    script = "import os; print('runtime', os.environ['FEDCORE_RUNTIME_ADDRESS']); exit(5)"
    launchers = [
        _launcher(state, fake_clock, tmp_path, script),
        ServerAppLauncher(
            LinkExec(state, fake_clock, runtime_address="127.0.0.1:1"),
            fake_clock,
            work_dir=tmp_path / "other",
            settings=LaunchSettings(command=(sys.executable, "-c", script), max_runs=1),
            runtime_address="10.0.0.1:9",
        ),
    ]
    runs = []
    for launcher in launchers:
        run = await _submit(state, tmp_path)
        runs.append(run)
        async with anyio.create_task_group() as tasks:
            await tasks.start(launcher.serve)
            await _until(state, run.run_id, {RunStatus.FAILED})
            tasks.cancel_scope.cancel()
    first, second = runs
    for run, address, work in [(first, "127.0.0.1:1", "work"), (second, "10.0.0.1:9", "other")]:
        lines = [line.text for line in await state.get_logs(run.run_id)]
        pid = (tmp_path / work / "runs" / f"{run.run_id}-1.pid").read_text().strip()
        assert lines[0] == f"[exec] ServerApp process {pid} started (attempt 1)"
        assert f"runtime {address}" in lines


async def test_runs_past_max_runs_wait_for_a_free_slot(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = (
        "import os, sys, pathlib\n"
        f"gate = pathlib.Path({str(gate)!r})\n"
        "gate.mkdir(exist_ok=True)\n"
        "(gate / os.environ['FEDCORE_RUN_ID']).write_text('')\n"
        "sys.exit(6)\n"
    )
    runs = [await _submit(state, tmp_path) for _ in range(3)]
    async with anyio.create_task_group() as tasks:
        await tasks.start(_launcher(state, fake_clock, tmp_path, script, max_runs=1).serve)
        for run in runs:
            await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    claims = [await state.get_logs(run.run_id) for run in runs]
    assert all(lines[0].text.endswith("(attempt 1)") for lines in claims)
    assert sorted(path.name for path in gate.iterdir()) == sorted(str(r.run_id) for r in runs)


async def test_a_bundle_that_cannot_be_unpacked_fails_the_run(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    run = await state.create_run({}, bundle_hash=await state.put_bundle(b"not a zip file"))
    async with anyio.create_task_group() as tasks:
        await tasks.start(_launcher(state, fake_clock, tmp_path, "pass").serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert failed.reason.startswith("could not launch the ServerApp: ")
    assert "zip" in failed.reason
    assert not (tmp_path / "work" / "runs").exists()


async def test_a_process_that_cannot_be_started_fails_its_run_and_the_launcher_goes_on(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    first = await _submit(state, tmp_path)
    launcher = ServerAppLauncher(
        LinkExec(state, fake_clock, runtime_address="127.0.0.1:1"),
        fake_clock,
        work_dir=tmp_path / "work",
        settings=LaunchSettings(command=(str(tmp_path / "no-such-python"),), max_restarts=0),
    )
    async with anyio.create_task_group() as tasks:
        await tasks.start(launcher.serve)
        failed = await _until(state, first.run_id, {RunStatus.FAILED})
        second = await _submit(state, tmp_path)  # the launcher still launches
        failed_too = await _until(state, second.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    for run in (failed, failed_too):
        assert run.reason.startswith("could not launch the ServerApp: FileNotFoundError"), run


async def test_calls_are_retried_while_the_link_is_away(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    service = FlakyExec(state, fake_clock, claim_runs=2, start_run=1)
    run = await _submit(state, tmp_path)
    launcher = ServerAppLauncher(
        service,
        fake_clock,
        work_dir=tmp_path / "work",
        settings=LaunchSettings(
            command=(sys.executable, "-c", "import sys; sys.exit(7)"),
            claim_lease=1000,  # the clock moves 10 s at a time: no claim runs out meanwhile
            max_restarts=0,
        ),
    )
    async with anyio.create_task_group() as tasks:
        await tasks.start(launcher.serve)
        with anyio.fail_after(20):
            while any(service.failures.values()):
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(10)  # past each pause between tries
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert service.refused == ["claim_runs", "claim_runs", "start_run"]
    assert failed.reason == "the ServerApp process exited with status 7"


class CountingExec(LinkExec):
    """A LinkExec that counts the bundles it hands out."""

    def __init__(self, state: InMemoryLinkState, clock: FakeClock) -> None:
        super().__init__(state, clock, runtime_address="127.0.0.1:7")
        self.bundles_fetched = 0

    async def get_bundle(self, bundle_hash: str) -> bytes:
        self.bundles_fetched += 1
        return await super().get_bundle(bundle_hash)


async def test_a_bundle_unpacked_here_already_is_not_fetched_again(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    service = CountingExec(state, fake_clock)
    launcher = ServerAppLauncher(
        service,
        fake_clock,
        work_dir=tmp_path / "work",
        settings=LaunchSettings(
            command=(sys.executable, "-c", "import sys; sys.exit(7)"), max_restarts=0
        ),
    )
    async with anyio.create_task_group() as tasks:
        await tasks.start(launcher.serve)
        for _ in range(2):  # the same app, twice: one bundle
            run = await _submit(state, tmp_path)
            await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert service.bundles_fetched == 1
    assert len(list((tmp_path / "work" / "bundles").iterdir())) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
async def test_an_app_user_runs_the_process_as_itself_on_a_private_copy_of_the_app(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)  # the copies go to /tmp, which nobody can reach
    nobody = AppUser.named("nobody")
    script = (
        "id -u; id -g; echo home=$HOME\n"
        'read -r secret <&"$FEDCORE_RUN_SECRET_FD"; echo secret-length ${#secret}\n'
        'test -r "$FEDCORE_APP_DIR/pyproject.toml" && echo app-readable\n'
        'test "$(pwd)" = "$TMPDIR" && echo in-its-own-directory\n'
        f"cat /proc/{os.getpid()}/environ > /dev/null 2>&1 || echo exec-environ-private\n"
        "exit 3\n"
    )
    before = _app_copies()
    run = await _submit(state, tmp_path)
    launcher = ServerAppLauncher(
        LinkExec(state, fake_clock, runtime_address="127.0.0.1:1"),
        fake_clock,
        work_dir=tmp_path / "work",
        settings=LaunchSettings(
            command=("/bin/bash", "-c", script), app_user=nobody, max_restarts=0
        ),
    )
    async with anyio.create_task_group() as tasks:
        await tasks.start(launcher.serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert failed.reason == "the ServerApp process exited with status 3"
    lines = [line.text for line in await state.get_logs(run.run_id)]
    said = lines[
        lines.index("[exec] the ServerApp process exited with status 3; its last output:") + 1 :
    ]
    assert said[:3] == [str(nobody.uid), str(nobody.gid), f"home={nobody.home}"]
    assert int(said[3].split()[1]) >= 32
    assert said[4:] == ["app-readable", "in-its-own-directory", "exec-environ-private"]
    assert _app_copies() == before, "the private copy is left behind"


def _app_copies() -> set[Path]:
    return set(Path("/tmp").glob("fedcore-app-*"))


def test_an_app_user_is_refused_when_it_cannot_be_switched_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(UsageError, match="no such user"):
        AppUser.named("no-such-user-here")
    with pytest.raises(UsageError, match="isolates nothing"):
        AppUser.named("root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UsageError, match="needs the exec to run as root"):
        AppUser.named("nobody")
