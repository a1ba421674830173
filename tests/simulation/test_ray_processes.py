"""The ray backend as a user runs it: whole ``fedcore simulate`` processes, and a cluster.

A run on a Ray of its own leaves no process behind, after it ends and after a Ctrl-C
(``reaper.py`` adopts every process of the tree and reports what outlived it); an
address where no Ray answers is an error naming it, at once or by the deadline, never
a hang; Ray missing is one line. Then a two-node cluster (``ray start --head`` and
``ray start --address``, one CPU each, in a network namespace of their own: see
``namespaces.py``) runs W3 with the app directory shipped to both nodes, and ends with
the process backend's model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from namespaces import Namespace
from w3_models import EXAMPLE, same_bits, w3_model

from fedcore.testing.deployment import FEDCORE
from fedcore.testing.network import closed_port

HERE = Path(__file__).resolve().parent
REAPER = HERE / "reaper.py"
RAY = Path(sys.executable).with_name("ray")
ASKING = ["simulate", "pool_apps:asking", "-n", "4", "--backend", "ray", "--seed", "0"]


def _environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _reaped(*arguments: str, interrupt_on: str | None = None) -> dict[str, Any]:
    """``fedcore ARGUMENTS`` under ``reaper.py``: its status, stderr, and what outlived it."""
    options = [] if interrupt_on is None else ["--interrupt-on", interrupt_on]
    done = subprocess.run(
        [sys.executable, str(REAPER), *options, "--", str(FEDCORE), *arguments],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=115,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.ray
def test_a_run_on_a_ray_of_its_own_leaves_no_process_behind() -> None:
    report = _reaped(*ASKING)
    assert report["status"] == 0, report["stderr"][-3000:]
    assert "replies: 4" in report["stdout"]
    assert "ray: 4 ClientApp runs on 1 node" in report["stderr"]
    assert report["left"] == {}


@pytest.mark.ray
def test_ctrl_c_ends_the_run_its_actors_and_its_ray() -> None:
    report = _reaped(
        "simulate", "pool_apps:hanging", "-n", "2", "--backend", "ray", interrupt_on=" actors on "
    )
    assert report["status"] == 130, report["stderr"][-3000:]
    assert report["left"] == {}


def test_without_ray_one_line_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    path = os.pathsep.join([str(tmp_path), str(HERE)])
    done = subprocess.run(
        [str(FEDCORE), *ASKING],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "error: the ray backend needs Ray, which is not installed: pip install 'fedcore[ray]'"
    )


@pytest.mark.ray
def test_an_address_where_nothing_listens_is_an_error_at_once() -> None:
    address = f"127.0.0.1:{closed_port()}"
    done = subprocess.run(
        [str(FEDCORE), *ASKING, "--ray-address", address],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"error: no Ray cluster answers at {address} (Connection refused)"
    )


_SILENT = """\
import socket, sys
import fedcore.simulation.backends.ray_cluster as cluster
from fedcore.cli import main

cluster.CONNECT_TIMEOUT = 3.0
server = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
address = f"127.0.0.1:{server.getsockname()[1]}"
sys.argv = ["fedcore", *sys.argv[1:], "--ray-address", address]
print(address, flush=True)
main()
"""


@pytest.mark.ray
def test_an_address_where_ray_never_connects_is_an_error_by_the_deadline() -> None:
    """ray.init retries such an address for good; the backend gives up after its deadline
    (3 s here), naming the address. In a namespace of its own: Ray would try the
    machine's address, not loopback's."""
    with Namespace() as namespace:
        done = subprocess.run(
            namespace.command([sys.executable, "-c", _SILENT, *ASKING]),
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    address = done.stdout.strip()
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"error: could not connect to the Ray cluster at {address} within 3 s: is Ray "
        f"running there, and the same version as here (ray {_ray_version()})?"
    )


def _ray_version() -> str:
    import ray

    version: str = ray.__version__
    return version


class _Started:
    """A process of the test's, its output read line by line as it comes."""

    def __init__(self, command: list[str], environment: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 90.0) -> None:
        def seen() -> bool:
            return any(text in line for line in self.lines) or "" in self.lines

        with self._changed:
            self._changed.wait_for(seen, timeout)
            assert any(text in line for line in self.lines), "".join(self.lines)[-3000:]

    def end(self) -> None:
        """SIGTERM (``ray start --block`` then stops its node's processes), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def short_temp_dirs() -> Iterator[list[Path]]:
    """Two short temporary directories: Ray's Unix sockets live in them (107-byte paths)."""
    made = [Path(tempfile.mkdtemp(prefix="fcray", dir="/tmp")) for _ in range(2)]
    yield made
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


_DRIVER = """\
import sys
import numpy as np
import fedcore as fc

example, address, out = sys.argv[1:]
result = fc.run_simulation(example, nodes=100, seed=0, backend="ray", ray_address=address)
np.savez(out, **dict(result.value))
"""


def _node_id(temp_dir: Path) -> str:
    """The node id a Ray node writes into the names of its port files."""
    names = {path.name.rsplit("_", 1)[-1] for path in temp_dir.glob("session_latest/*_port_*")}
    (node_id,) = names
    return node_id


def _left_running(directories: list[Path]) -> list[str]:
    """Command lines of processes that name one of ``directories``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(str(directory) in text for directory in directories):
            found.append(text[:200])
    return found


@pytest.mark.slow  # a two-node Ray cluster in its own namespace: 20 s of CI's 20 minutes
@pytest.mark.ray
def test_w3_on_a_two_node_cluster_runs_on_both_and_ends_as_on_the_process_backend(
    tmp_path: Path, short_temp_dirs: list[Path]
) -> None:
    head_dir, worker_dir = short_temp_dirs
    # The cluster's token, in a home of its own: Ray reads it from ~/.ray/auth_token.
    environment = _environment(HOME=str(tmp_path), RAY_AUTH_MODE="token")
    subprocess.run(
        [str(RAY), "get-auth-token", "--generate"],
        env=environment,
        capture_output=True,
        timeout=60,
        check=True,
    )
    started: list[_Started] = []
    with Namespace() as namespace:
        try:
            head = _Started(
                namespace.command(
                    [str(RAY), "start", "--head", "--num-cpus", "1", "--port", "6379",
                     "--temp-dir", str(head_dir), "--include-dashboard", "false", "--block"]
                ),
                environment,
            )  # fmt: skip
            started.append(head)
            head.wait_for("Ray runtime started")
            worker = _Started(
                namespace.command(
                    [str(RAY), "start", "--address", "127.0.0.1:6379", "--num-cpus", "1",
                     "--temp-dir", str(worker_dir), "--block"]
                ),
                environment,
            )  # fmt: skip
            started.append(worker)
            worker.wait_for("Ray runtime started")
            out = tmp_path / "model.npz"
            driver = subprocess.run(
                namespace.command(
                    [sys.executable, "-c", _DRIVER, str(EXAMPLE), "127.0.0.1:6379", str(out)]
                ),
                env=environment,
                capture_output=True,
                text=True,
                timeout=110,
                check=False,
            )
            assert driver.returncode == 0, driver.stderr[-3000:]
            node_ids = {_node_id(head_dir), _node_id(worker_dir)}
        finally:
            for process in reversed(started):
                process.end()
    assert _left_running(short_temp_dirs) == []
    (placement,) = [line for line in driver.stderr.splitlines() if "ClientApp runs on" in line]
    assert "600 ClientApp runs on 2 nodes" in placement, placement
    ran_on = dict(re.findall(r"\((\w{8})\) ×(\d+)", placement))
    assert {node_id[:8] for node_id in node_ids} == set(ran_on), placement
    with np.load(out) as saved:
        cluster_model = {key: saved[key] for key in saved.files}
    assert same_bits(cluster_model, w3_model("process"))
