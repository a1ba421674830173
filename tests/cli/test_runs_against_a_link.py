"""``fedcore run / ls / log / stop`` against real processes: a link on loopback, whole commands.

The mistakes a first run makes: ``--link`` given the fleet (gRPC) port or some
other server, and Ctrl-C on a streamed run, which ends the command, not the run.
"""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import FEDCORE, Deployment
from fedcore.testing.network import closed_port

CHAOS_APP = Path(__file__).resolve().parents[1] / "deployment" / "chaos_app"
COMMANDS = [["ls"], ["log", "7"], ["stop", "7"], ["run", str(CHAOS_APP)]]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(tmp_path_factory.mktemp("link")) as deployment:
        deployment.start_link()
        yield deployment


@pytest.fixture(scope="module")
def foreign_http() -> Iterator[str]:
    """An HTTP server that is not fedcore's (Python's own), on a free loopback port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on the test's stderr."""


@pytest.mark.parametrize("command", COMMANDS)
def test_the_fleet_port_given_as_link_names_the_mistake_in_one_line(
    link: Deployment, command: list[str]
) -> None:
    assert link.link is not None
    fleet = link.link.address("fleet")
    done = link.fedcore(*command, "--link", fleet)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {fleet} is not a fedcore control API (it looks like the fleet")
    assert "--control-address, default 127.0.0.1:9093" in line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_http_server_that_is_not_fedcore_is_named_in_one_line(
    link: Deployment, foreign_http: str, command: list[str]
) -> None:
    done = link.fedcore(*command, "--link", foreign_http)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {foreign_http} is not a fedcore control API (an HTTP server")


def test_another_port_of_the_link_is_not_its_control_api(link: Deployment) -> None:
    assert link.link is not None
    runtime = link.link.address("runtime")
    done = link.fedcore("ls", "--link", runtime)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {runtime} is not a fedcore control API")


def test_a_port_where_nothing_listens_says_so_in_one_line(link: Deployment) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"
    done = link.fedcore("ls", "--link", nowhere)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"error: the link at {nowhere} is unavailable: nothing listens on {nowhere} "
        f"(connection refused)"
    )


def test_ctrl_c_on_a_streamed_run_says_it_goes_on_and_how_to_stop_it(link: Deployment) -> None:
    assert link.link is not None
    control = link.link.address("control")
    # No node joins: the run waits for nodes, streaming, until the test interrupts it.
    streaming = subprocess.Popen(
        [str(FEDCORE), "run", str(CHAOS_APP), "--stream", "--link", control],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=link.cli_environment(),
        cwd=link.root,
    )
    try:
        assert streaming.stdout is not None
        first = streaming.stdout.readline()
        assert first.startswith("run "), first
        run_id = first.split()[1]
        streaming.send_signal(signal.SIGINT)
        _, err = streaming.communicate(timeout=30)
    finally:
        if streaming.poll() is None:
            streaming.kill()
            streaming.communicate()
    assert streaming.returncode == 130, err
    assert err.splitlines()[-1] == (
        f"interrupted: run {run_id} goes on on the link; "
        f"stop it with: fedcore stop {run_id} --link {control}"
    )
    # What was kept of the run so far stays, and says the run has not ended.
    (kept,) = [line for line in err.splitlines() if line.startswith("the run's results so far")]
    assert f"fedcore pull {run_id} DIR --link {control}" in kept
    partial = Path(kept.split(" are in ", 1)[1].split("; ", 1)[0])
    assert json.loads((partial / "run.json").read_text())["status"] in ("pending", "running")
    (run,) = [r for r in json.loads(link.fedcore("ls", "--json").stdout) if r["run_id"] == run_id]
    assert not run["status"].startswith("finished"), run
    stopped = link.fedcore("stop", run_id, "--link", control, "--json")
    assert json.loads(stopped.stdout)["status"] == "finished:stopped"
