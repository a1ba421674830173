"""The ServerApp launcher: claims, launches with the secret in the environment, reports exits.

A stand-in command plays the ServerApp process (a few lines of Python), so these
tests exercise the launcher's decisions without the runtime API.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fedcore.apps.bundle import pack_bundle
from fedcore.domain import Run, RunStatus
from fedcore.roles.exec.launcher import LaunchSettings, ServerAppLauncher
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
        state,
        clock,
        runtime_address="127.0.0.1:1",
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
        "secret = os.environ['FEDCORE_RUN_SECRET']\n"
        "argv = open('/proc/self/cmdline', 'rb').read().decode()\n"
        "print('secret on argv' if secret in argv else 'secret only in the environment')\n"
        "app = os.path.isdir(os.environ['FEDCORE_APP_DIR'])\n"
        "print('run', os.environ['FEDCORE_RUN_ID'], 'app', app)\n"
        "sys.exit(3)\n"
    )
    run = await _submit(state, tmp_path)
    async with anyio.create_task_group() as tasks:
        await tasks.start(_launcher(state, fake_clock, tmp_path, script).serve)
        failed = await _until(state, run.run_id, {RunStatus.FAILED})
        tasks.cancel_scope.cancel()
    assert failed.reason == "the ServerApp process exited with status 3"
    lines = [line.text for line in await state.get_logs(run.run_id)]
    assert "secret only in the environment" in lines
    assert f"run {run.run_id} app True" in lines


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
            fake_clock.advance(5.1)  # the grace to exit by itself, then it is terminated
            with anyio.fail_after(20):
                await anyio.wait_readable(exited)  # a pidfd turns readable when its process ends
        finally:
            os.close(exited)
        tasks.cancel_scope.cancel()
    assert (await state.get_run(run.run_id)).reason == "operator"


async def test_a_claim_left_by_a_dead_exec_expires_and_the_run_launches_once_more(
    state: InMemoryLinkState, fake_clock: FakeClock, tmp_path: Path
) -> None:
    run = await _submit(state, tmp_path)
    (dead,) = await state.claim_runs(limit=1, lease=5.0)  # an exec that dies right after
    script = "import sys; print('attempt'); sys.exit(4)"
    async with anyio.create_task_group() as tasks:
        await tasks.start(_launcher(state, fake_clock, tmp_path, script).serve)
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
