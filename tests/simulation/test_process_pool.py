"""The process-pool backend: warm workers, crashes, TTLs, GPUs, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from anyio._backends._asyncio import WorkerThread
from pool_apps import client

import fedcore as fc
from fedcore.testing.backend import live_children
from fedcore.workers.pool import PIPELINE_DEPTH
from fedcore.workers.shared_memory import ROOT

pytestmark = pytest.mark.anyio


def _workers() -> set[int]:
    """This process's live children that are pool workers: not, say, a shared Ray's."""
    found = set()
    for pid in live_children():
        try:
            if b"fedcore.workers.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except FileNotFoundError:
            continue
    return found


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has ended, all its threads too (it is not reaped here)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _segments() -> set[str]:
    return {path.name for path in ROOT.glob(f"fedcore-{os.getpid()}-*")}


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    before_children, before_segments = live_children(), _segments()
    yield
    assert live_children() <= before_children, "worker processes outlived the simulation"
    assert _segments() <= before_segments, "shared-memory segments were not unlinked"


def _app(main: Any) -> fc.App:
    server = fc.ServerApp()
    server.main()(main)
    return fc.App(server=server, client=client)


def _ask(message_type: str, **config: float) -> Any:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        nodes = await grid.get_node_ids()
        content = fc.RecordDict({"config": fc.ConfigRecord(config)})
        return await grid.send_and_receive([fc.Message(content, n, message_type) for n in nodes])

    return main


async def test_a_worker_killed_while_idle_costs_no_reply() -> None:
    """Its death shows before the next task is sent: the task goes to its replacement."""

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[set[int], list[fc.Message]]:
        nodes = await grid.get_node_ids()
        ask = [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        first = {int(reply.content["metrics"]["pid"]) for reply in await grid.send_and_receive(ask)}
        (victim,) = first
        os.kill(victim, signal.SIGKILL)
        with anyio.fail_after(10):
            while not _exited(victim):
                await anyio.lowlevel.checkpoint()
        again = [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        return first, await grid.send_and_receive(again)

    first, replies = (await fc.simulate(_app(main), nodes=3, max_workers=1, seed=0)).value
    assert [reply.error for reply in replies if reply.has_error()] == []
    assert {reply.content["metrics"]["pid"] for reply in replies}.isdisjoint(first)


async def test_workers_outlive_the_idle_threads_anyio_retires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker dies with its parent *thread* (PR_SET_PDEATHSIG): not with one of anyio's,
    which retire once idle (10 s; a tenth of a second here)."""
    monkeypatch.setattr(WorkerThread, "MAX_IDLE_TIME", 0.1)

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[set[int], list[fc.Message]]:
        nodes = await grid.get_node_ids()
        ask = [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        first = {int(reply.content["metrics"]["pid"]) for reply in await grid.send_and_receive(ask)}
        for _ in range(3):  # idle past the limit; the next call to a thread retires the idle
            await anyio.sleep(0.3)
            await anyio.to_thread.run_sync(lambda: None)
        again = [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        return first, await grid.send_and_receive(again)

    first, replies = (await fc.simulate(_app(main), nodes=4, max_workers=2, seed=0)).value
    assert [reply.error for reply in replies if reply.has_error()] == []
    assert {reply.content["metrics"]["pid"] for reply in replies} == first


async def test_fractional_gpus_pack_workers_onto_devices() -> None:
    replies = (
        await fc.simulate(
            _app(_ask("query.whoami")),
            nodes=40,
            resources=fc.Resources(num_cpus=1, num_gpus=0.5),
            system=fc.Resources(num_cpus=8, num_gpus=2),
            seed=0,
        )
    ).value
    by_pid: dict[float, set[float]] = {}
    for reply in replies:
        metrics = reply.content["metrics"]
        by_pid.setdefault(metrics["pid"], set()).add(metrics["device"])  # type: ignore[arg-type]
    assert len(by_pid) == 4
    assert sorted(device for devices in by_pid.values() for device in devices) == [0, 0, 1, 1]


def test_a_script_must_guard_its_simulation(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            """\
            import fedcore as fc
            client = fc.ClientApp()

            @client.query()
            def query(msg, context):
                return msg

            server = fc.ServerApp()

            @server.main()
            async def main(grid, context):
                return None

            fc.run_simulation(fc.App(server=server, client=client), nodes=2, max_workers=1)
            """
        )
    )
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode != 0
    assert "put that under `if __name__ == '__main__':`" in completed.stderr


async def test_large_replies_reuse_a_few_segments() -> None:
    """Outcome segments are released by the engine and written over by their worker."""

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[set[str], list[int]]:
        nodes = await grid.get_node_ids()
        model = fc.RecordDict({"arrays": fc.ArrayRecord({"w": np.ones(2**18, np.float32)})})
        seen: set[str] = set()
        totals = []
        for _ in range(3):
            messages = [fc.Message(model, n, "train") for n in nodes]
            async for reply in grid.receive(await grid.push_messages(messages)):
                totals.append(int(reply.content["arrays"]["w"].sum()))
                seen |= _segments()
        return seen, totals

    seen, totals = (await fc.simulate(_app(main), nodes=60, max_workers=2, seed=0)).value
    assert totals == [2**18] * 180
    # One content segment, and per worker a few outcome segments: those in its pipeline
    # and those the engine has not let go of yet. Without reuse there would be 180.
    assert len(seen) <= 2 * 2 * PIPELINE_DEPTH + 1, sorted(seen)


@pytest.mark.timeout(60, method="thread")  # a hang inside uvloop's C code ignores SIGALRM
def test_payloads_near_the_inline_limit_cross_whole_under_uvloop() -> None:
    """Tasks and outcomes of 16-63 KB go through the socket itself, several per worker,
    on the event loop run_simulation picks (uvloop when installed). A channel that gave
    up halfway through a frame would corrupt the stream or hang the round."""
    sizes = [n * 1024 // 4 for n in (16, 24, 32, 40, 48, 56, 63)]

    def main(grid: fc.SyncGrid, context: fc.Context) -> list[int]:
        nodes = grid.get_node_ids()
        totals = []
        for size in sizes * 2:
            model = fc.RecordDict({"arrays": fc.ArrayRecord({"w": np.ones(size, np.float32)})})
            replies = grid.send_and_receive([fc.Message(model, n, "train") for n in nodes])
            totals += [int(reply.content["arrays"]["w"].sum()) for reply in replies]
        return totals

    totals = fc.run_simulation(_app(main), nodes=24, max_workers=2, seed=0).value
    assert totals == [size for size in sizes * 2 for _ in range(24)]


def _processes_tagged(tag: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"FEDCORE_TEST_TAG={tag}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
    return found


def test_ctrl_c_stops_the_cli_and_its_workers() -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, "FEDCORE_TEST_TAG": tag, "PYTHONPATH": str(Path(__file__).parent)}
    fedcore = Path(sys.executable).with_name("fedcore")
    command = [str(fedcore), "simulate", "pool_apps:hanging", "-n", "2", "--max-workers", "2"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(_wait_for_line, process.stderr, "process pool: 2 workers")
        assert len(_processes_tagged(tag)) == 3  # the CLI and its two workers
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert _processes_tagged(tag) == []


async def _wait_for_line(stream: Any, text: str) -> None:
    with anyio.fail_after(60):
        while text not in await anyio.to_thread.run_sync(stream.readline):
            pass
