"""The node ↔ exec spawn protocol on a Unix socket: a process per request, on the node's channel.

The exec here starts a tiny stand-in for a worker: it reads one byte from its
channel and exits with that byte as its status, so a test decides how it ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from fedcore.errors import AppLoadError
from fedcore.workers import spawn
from fedcore.workers.spawn import serve_spawner, spawn_remote

pytestmark = pytest.mark.anyio

SECRET = "a-secret-of-the-exec-and-its-node"
STAND_IN = (
    "import os, sys\n"
    "channel = int(sys.argv[1])\n"
    "try:\n"
    "    os.write(channel, os.environ.get('GREETING', '?').encode())\n"
    "    data = os.read(channel, 1)\n"
    "except OSError:\n"
    "    data = b''\n"
    "sys.exit(data[0] if data else 0)\n"
)


def stand_in(channel: int) -> Sequence[str]:
    return [sys.executable, "-c", STAND_IN, str(channel)]


@asynccontextmanager
async def exec_at(path: Path, app_env: tuple[str, ...] = ()) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tasks:
        await tasks.start(partial(serve_spawner, path, SECRET, stand_in, app_env=app_env))
        yield
        tasks.cancel_scope.cancel()


async def spawned(
    path: Path,
    secret: str = SECRET,
    patience: float = spawn.CONNECT_PATIENCE,
    environment: dict[str, str] | None = None,
    defaults: dict[str, str] | None = None,
) -> tuple[socket.socket, spawn.RemoteProcess]:
    environment = {"GREETING": "hi"} if environment is None else environment
    ours, theirs = socket.socketpair()
    try:
        with theirs:
            process = await anyio.to_thread.run_sync(
                partial(
                    spawn_remote,
                    path,
                    secret,
                    theirs,
                    environment,
                    defaults or {},
                    patience=patience,
                )
            )
    except BaseException:
        ours.close()
        raise
    return ours, process


async def test_the_exec_starts_a_process_on_the_nodes_channel_and_reports_its_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "exec.sock"
    async with exec_at(path):
        assert path.stat().st_mode & 0o777 == 0o600
        ours, process = await spawned(path)
        with ours:
            assert await anyio.to_thread.run_sync(ours.recv, 2) == b"hi"  # env, channel
            assert process.poll() is None
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.01)
            ours.send(bytes([7]))
            assert await anyio.to_thread.run_sync(process.wait, 10.0) == 7
        assert process.poll() == 7
        assert process.pid != os.getpid()
    assert not path.exists(), "the exec removes its socket on the way out"


@pytest.mark.parametrize(("exec_sets", "seen"), [(None, b"df"), ("ex", b"ex")])
async def test_defaults_apply_only_where_the_exec_s_own_environment_is_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exec_sets: str | None, seen: bytes
) -> None:
    """The node's thread caps are defaults: a variable the exec's user set (and passes
    on) stands."""
    if exec_sets is None:
        monkeypatch.delenv("GREETING", raising=False)
    else:
        monkeypatch.setenv("GREETING", exec_sets)
    path = tmp_path / "exec.sock"
    async with exec_at(path, app_env=("GREETING",)):
        ours, process = await spawned(path, environment={}, defaults={"GREETING": "df"})
        with ours:
            assert await anyio.to_thread.run_sync(ours.recv, 2) == seen
            ours.send(bytes([0]))
            assert await anyio.to_thread.run_sync(process.wait, 10.0) == 0


async def test_the_process_gets_only_what_the_exec_passes_on_of_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GREETING", "ex")  # say, a credential of the exec's user
    path = tmp_path / "exec.sock"
    async with exec_at(path):
        ours, process = await spawned(path, environment={})
        with ours:
            assert await anyio.to_thread.run_sync(ours.recv, 2) == b"?"
            ours.send(bytes([0]))
            assert await anyio.to_thread.run_sync(process.wait, 10.0) == 0


async def test_a_kill_is_carried_out_by_the_exec(tmp_path: Path) -> None:
    path = tmp_path / "exec.sock"
    async with exec_at(path):
        ours, process = await spawned(path)
        with ours:
            process.kill()
            assert await anyio.to_thread.run_sync(process.wait, 10.0) == -9


async def test_a_wrong_secret_is_refused_and_nothing_starts(tmp_path: Path) -> None:
    path = tmp_path / "exec.sock"
    async with exec_at(path):
        with pytest.raises(AppLoadError, match="refused: not the exec's secret"):
            await spawned(path, secret="another-secret-entirely-wrong")


async def test_no_exec_listening_is_an_app_load_error_after_the_patience(tmp_path: Path) -> None:
    path = tmp_path / "nobody.sock"
    with pytest.raises(AppLoadError, match=r"no exec answers at .* is `fedcore serve"):
        await spawned(path, patience=0.3)


async def test_an_exec_that_goes_away_takes_its_processes(tmp_path: Path) -> None:
    path = tmp_path / "exec.sock"
    async with exec_at(path):
        ours, process = await spawned(path)
    with ours:
        assert await anyio.to_thread.run_sync(process.wait, 10.0) == -9
