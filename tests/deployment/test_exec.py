"""The exec in a process of its own (``fedcore serve --role exec``) on a real deployment.

A link started with ``--no-local-exec`` launches nothing itself: an external exec
claims its runs over the signed exec API. RELIABILITY.md's "an exec dies after
claiming" is staged with a relay between the first exec and the link that holds
back the link's answers: the link hands that exec a claim the exec never sees, and
the exec is then killed — a claim made and abandoned, whatever the timing. The claim
runs out (a 2 s lease), the run goes back to pending, and a second exec launches it
once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from fedcore.runtime.addresses import Address
from fedcore.testing.deployment import Deployment, printed_objects

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
LAUNCHED = "[exec] ServerApp process"

pytestmark = pytest.mark.timeout(60)


class Relay:
    """A TCP relay to ``target`` that can hold back what the target answers.

    A one-way partition: requests still reach the target, its answers stop here.
    """

    def __init__(self, target: Address) -> None:
        self._target = (target.host, target.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open = threading.Event()
        self._open.set()
        self.held = threading.Event()
        """Set once an answer arrived while answers were held back."""
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def hold_answers(self) -> None:
        self._open.clear()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
                far = socket.create_connection(self._target)
            except OSError:
                return
            self._sockets += [near, far]
            for source, sink, gated in [(near, far, False), (far, near, True)]:
                thread = threading.Thread(target=self._pump, args=(source, sink, gated))
                thread.daemon = True
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, gated: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if gated and not self._open.is_set():
                    self.held.set()
                    self._open.wait()
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            return

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):  # not connected (any more)
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.set()
        for thread in self._threads:
            thread.join(timeout=10)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A link that leaves its runs to external execs, and one node."""
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link(
            "--exec-address", "127.0.0.1:0",
            "--exec-secret-file", str(deployment.exec_secret_file),
            "--no-local-exec",
        )  # fmt: skip
        deployment.start_node("partition-id=0 num-partitions=1")
        (tmp_path / "markers").mkdir()
        yield deployment


def _submit(deployment: Deployment, **config: Any) -> str:
    markers = str(deployment.root / "markers")
    return deployment.submit(CHAOS_APP, **{"marker-dir": markers, "min-nodes": 1, **config})


def _rounds(lines: list[str]) -> list[int]:
    return [printed["round"] for printed in printed_objects(lines)]


def test_a_link_without_its_own_exec_has_its_runs_launched_by_an_external_one(
    deployment: Deployment,
) -> None:
    assert deployment.link is not None
    assert set(deployment.link.listeners) == {"fleet", "control", "runtime", "exec"}
    secret_file = deployment.exec_secret_file
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32
    run_id = _submit(deployment, rounds=2)
    launcher = deployment.start_exec()
    final, lines = deployment.follow(run_id)
    assert final["status"] == "finished:completed", final
    assert _rounds(lines) == [1, 2]
    pid = (deployment.root / "exec0" / "runs" / f"{run_id}-1.pid").read_text().strip()
    assert [line for line in lines if line.startswith(LAUNCHED)] == [
        f"{LAUNCHED} {pid} started (attempt 1)"
    ]
    assert not (deployment.root / "link" / "runs").exists()  # the link launched nothing
    for server in deployment.servers:
        assert secret not in server.tail(1000)
    argv = Path(f"/proc/{launcher.process.pid}/cmdline").read_bytes()
    assert secret.encode() not in argv


def test_an_exec_killed_right_after_claiming_leaves_the_run_to_another_exec_once(
    deployment: Deployment,
) -> None:
    assert deployment.link is not None
    with Relay(deployment.link.listeners["exec"]) as relay:
        doomed = deployment.start_exec("--claim-lease", "2", link_exec=relay.address)
        relay.hold_answers()
        run_id = _submit(deployment, rounds=2)
        assert relay.held.wait(timeout=20), "the link did not answer the exec's claim"
        listed = json.loads(deployment.fedcore("ls", "--json").stdout)
        assert [(run["run_id"], run["status"]) for run in listed] == [(run_id, "starting")]
        deployment.kill(doomed)
    assert deployment.app_pids() == []
    assert not (deployment.root / "exec0" / "runs").exists()  # it never launched
    deployment.start_exec("--claim-lease", "2")
    final, lines = deployment.follow(run_id)
    assert final["status"] == "finished:completed", final
    assert _rounds(lines) == [1, 2]
    pid = (deployment.root / "exec1" / "runs" / f"{run_id}-2.pid").read_text().strip()
    assert [line for line in lines if line.startswith(LAUNCHED)] == [
        f"{LAUNCHED} {pid} started (attempt 2)"
    ]
