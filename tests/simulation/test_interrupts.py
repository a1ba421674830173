"""Interrupting ``fedcore simulate``: every ending signal cleans up as Ctrl-C does.

Each test runs the console script as a user would, as a real process, and watches
its output until the run is under way; then it signals it and checks what is left:
no worker process (each is watched through a pidfd opened while the run goes) and no
shared-memory segment named for the interrupted process.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import pytest
from interrupt_apps import client

import fedcore as fc
from fedcore.workers.shared_memory import ROOT

HERE = Path(__file__).parent
FEDCORE = Path(sys.executable).with_name("fedcore")
PROMPTLY = 30.0
"""Seconds an interrupted run may take to end: generous, for a loaded machine."""
IGNORE_AND_EXEC = (
    "import os, signal, sys; signal.signal(int(sys.argv[1]), signal.SIG_IGN); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


class Simulation:
    """``fedcore simulate`` in a process of its own, its output collected as it comes."""

    def __init__(self, *args: str, session: bool = False, ignoring: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        command = [str(FEDCORE), "simulate", *args, "--seed", "0"]
        if ignoring is not None:  # as `nohup` does: an ignored signal stays ignored over exec
            command = [sys.executable, "-c", IGNORE_AND_EXEC, str(ignoring), *command]
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=session,
        )
        self._watched: list[Worker] = []
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._ended = 0
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            with self._changed:
                lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended += 1
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Wait until a line of its output contains ``text``; fail if it ends first."""

        def seen() -> bool:
            return any(text in line for line in (*self.out, *self.err))

        with self._changed:
            self._changed.wait_for(lambda: seen() or self._ended == 2, timeout)
            assert seen(), f"no {text!r} in its output:\n{''.join(self.err)[-2000:]}"

    def workers(self) -> list[Worker]:
        """Every live process below this one, watched from now on."""
        found = []
        parents = [self.process.pid]
        while parents:
            for pid in _children(parents.pop()):
                found.append(Worker(pid))
                parents.append(pid)
        self._watched.extend(found)
        return found

    def segments(self) -> set[str]:
        """Shared-memory segments named for this process."""
        return {path.name for path in ROOT.glob(f"fedcore-{self.process.pid}-*")}

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        for path in ROOT.glob(f"fedcore-{self.process.pid}-*"):
            path.unlink(missing_ok=True)
        for worker in self._watched:
            os.close(worker.descriptor)


class Worker:
    """A process watched through a pidfd: its end is seen even if its pid is reused."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.descriptor = os.pidfd_open(pid)

    def ended(self, timeout: float = 0.0) -> bool:
        """Whether it has ended, waiting for that up to ``timeout`` seconds."""
        readable, _, _ = select.select([self.descriptor], [], [], timeout)
        return bool(readable)


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    for task in tasks:
        try:  # threads (and so their task entries) come and go meanwhile
            found.extend(int(child) for child in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


@pytest.fixture
def simulations() -> Iterator[list[Simulation]]:
    started: list[Simulation] = []
    yield started
    for simulation in started:
        simulation.end()


ENDINGS = [
    pytest.param(signal.SIGTERM, 128 + signal.SIGTERM, False, id="SIGTERM"),
    pytest.param(signal.SIGHUP, 128 + signal.SIGHUP, False, id="SIGHUP"),
    pytest.param(signal.SIGINT, 130, False, id="SIGINT"),
    pytest.param(signal.SIGTERM, 128 + signal.SIGTERM, True, id="SIGTERM-to-the-group"),
]


@pytest.mark.parametrize(("signum", "status", "to_group"), ENDINGS)
def test_an_ending_signal_stops_the_workers_and_frees_shared_memory(
    simulations: list[Simulation], signum: signal.Signals, status: int, to_group: bool
) -> None:
    simulation = Simulation(
        "interrupt_apps:model", "-n", "4", "--max-workers", "2", session=to_group
    )
    simulations.append(simulation)
    simulation.wait_for("round 2/")
    workers = simulation.workers()
    assert len(workers) == 2
    assert simulation.segments(), "the run should hold its model in shared memory"

    if to_group:  # as a terminal's hangup, `docker stop` or systemd may: every process
        os.killpg(simulation.process.pid, signum)
    else:
        simulation.process.send_signal(signum)

    ended = simulation.process.wait(timeout=PROMPTLY)
    assert [worker.pid for worker in workers if not worker.ended()] == []
    assert simulation.segments() == set()
    assert ended == status
    assert "Traceback" not in "".join(simulation.err)


def test_a_hangup_ignored_as_under_nohup_lets_the_run_go_on(
    simulations: list[Simulation],
) -> None:
    simulation = Simulation(
        "interrupt_apps:model", "-n", "2", "--max-workers", "1", ignoring=signal.SIGHUP
    )
    simulations.append(simulation)
    simulation.wait_for("round 2/")

    simulation.process.send_signal(signal.SIGHUP)
    simulation.wait_for("round 5/")
    assert simulation.process.poll() is None

    simulation.process.send_signal(signal.SIGTERM)
    assert simulation.process.wait(timeout=PROMPTLY) == 128 + signal.SIGTERM
    assert simulation.segments() == set()


def test_a_second_ctrl_c_ends_a_stuck_inline_run_at_once(simulations: list[Simulation]) -> None:
    simulation = Simulation("interrupt_apps:stuck", "-n", "2", "--backend", "inline")
    simulations.append(simulation)
    simulation.wait_for("stuck")

    simulation.process.send_signal(signal.SIGINT)
    simulation.wait_for("stopping the simulation")  # the first starts a clean shutdown
    simulation.process.send_signal(signal.SIGINT)

    assert simulation.process.wait(timeout=PROMPTLY) == 130
    simulation.wait_for("exiting at once")
    err = "".join(simulation.err)
    assert "Traceback" not in err
    assert "threading" not in err


def test_a_second_sigterm_ends_a_run_that_does_not_let_go_and_frees_its_memory(
    simulations: list[Simulation],
) -> None:
    simulation = Simulation("interrupt_apps:clinging", "-n", "4", "--max-workers", "2")
    simulations.append(simulation)
    simulation.wait_for("round 2/")
    workers = simulation.workers()
    assert simulation.segments(), "the run should hold its model in shared memory"

    simulation.process.send_signal(signal.SIGTERM)
    simulation.wait_for("stopping the simulation")
    assert simulation.segments(), "the ServerApp clings: its pool is not left yet"
    simulation.process.send_signal(signal.SIGTERM)

    assert simulation.process.wait(timeout=PROMPTLY) == 128 + signal.SIGTERM
    simulation.wait_for("exiting at once")
    assert "Traceback" not in "".join(simulation.err)
    assert simulation.segments() == set()
    # Its workers die with it (Linux kills them as their parent exits): a moment after.
    assert [worker.pid for worker in workers if not worker.ended(PROMPTLY)] == []


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    return ended.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a process that stays alive through the test."""
    waiting = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    yield waiting.pid
    waiting.communicate(b"\n", timeout=30)


def test_a_simulation_removes_the_segments_of_dead_simulations_only(live_pid: int) -> None:
    dead = _dead_pid()
    stale = ROOT / f"fedcore-{dead}-0badc0de-0"
    stale_of_a_worker = ROOT / f"fedcore-{dead}-0badc0de-w1-0"
    kept = [
        ROOT / f"fedcore-{live_pid}-0badc0de-0",  # its creator is alive
        ROOT / f"fedcore-{os.getpid()}-0badc0de-0",  # so is this one's: this process
        ROOT / f"notfedcore-{dead}-0badc0de-0",  # not of fedcore's naming scheme
        ROOT / f"fedcore-{dead}-notours",
    ]
    for path in (stale, stale_of_a_worker, *kept):
        path.write_bytes(b"x" * 4096)
    try:
        fc.run_simulation(
            fc.App(server=_one_round_server(), client=client),
            nodes=2,
            max_workers=1,
            seed=0,
        )
        assert not stale.exists()
        assert not stale_of_a_worker.exists()
        assert [path.name for path in kept if not path.exists()] == []
    finally:
        for path in (stale, stale_of_a_worker, *kept):
            path.unlink(missing_ok=True)


def _one_round_server() -> fc.ServerApp:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        nodes = await grid.get_node_ids()
        content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": np.zeros(4)})})
        await grid.send_and_receive([fc.Message(content, n, "train") for n in nodes])

    return server
