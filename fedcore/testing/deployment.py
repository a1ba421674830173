"""Real deployments for tests and benchmarks: a link, nodes and execs as processes on loopback.

:class:`Deployment` starts ``fedcore serve`` processes with ``--ready-file``, waits
for each file (a condition with a deadline, never a fixed sleep), reads the bound
ports from it, and on leaving kills every process it started — by pid, never by
name — and waits for them. Output of each process goes to a file under the
deployment's directory, and a process that dies before it is ready raises with the
end of that file. A SIGTERM to the process holding a Deployment (``kill`` of a pytest
or benchmark run) ends it through the same cleanup instead of orphaning the servers,
as long as nothing else had taken SIGTERM. The ``fedcore`` commands it runs present
the link's control token (made by the link in its work directory), as its operator's
would.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from fedcore.auth.control_token import TOKEN_ENV, link_token_file
from fedcore.runtime.addresses import Address
from fedcore.runtime.ready import read_ready_file
from fedcore.testing.waiting import wait_until

FEDCORE = Path(sys.executable).parent / "fedcore"
_CLI = "import sys; from fedcore.cli import main; sys.argv[0] = 'fedcore'; main()"
"""The ``fedcore`` command, on an interpreter other than the venv's (``python -c``)."""
READY_DEADLINE = 30.0


@dataclass
class Server:
    """A ``fedcore serve`` process and what its ready file said."""

    name: str
    process: subprocess.Popen[bytes]
    output: Path
    listeners: dict[str, Address] = field(default_factory=dict)

    def address(self, listener: str) -> str:
        return str(self.listeners[listener])

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.output.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


class Deployment:
    """A link and its nodes under ``root``; use it as a context manager.

    ``python``: the interpreter the ``fedcore serve`` processes run on (and so the app
    processes they start), with ``environment`` added to theirs; by default this
    venv's ``fedcore`` script. (A test of ``--app-user`` gives one the app user can run.)
    """

    def __init__(
        self,
        root: Path,
        *,
        heartbeat_interval: float = 1.0,
        heartbeat_patience: float = 2.0,
        python: Path | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_patience = heartbeat_patience
        self.python = python
        self.environment = dict(environment or {})
        self.servers: list[Server] = []
        self.link: Server | None = None
        self.link_work_dir = root / "link"
        self._link_flags: list[str] = []
        self._took_sigterm = False

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            self._took_sigterm = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            # The nodes and execs together (none needs another to stop), then the links,
            # which they may still be telling that they go.
            links = [server for server in self.servers if server.name == "link"]
            self.stop_all([server for server in self.servers if server not in links])
            self.stop_all(links)
            for pid in self.app_pids():
                _kill_pid(pid)
        finally:
            if self._took_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self._took_sigterm = False

    @property
    def exec_secret_file(self) -> Path:
        """The secret the link's exec API and the execs share (made by the first to start)."""
        return self.root / "exec.secret"

    def app_pids(self) -> list[int]:
        """ServerApp processes the links and execs started that still run.

        They outlive a killed link or exec; each left its pid in its work directory.
        """
        alive = []
        for pid_file in sorted(self.root.glob("*/runs/*.pid")):
            pid = int(pid_file.read_text())
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"fedcore.runtime.serverapp" in cmdline:  # not a recycled pid
                alive.append(pid)
        return alive

    @property
    def control_token_file(self) -> Path:
        """The file where the link keeps its control token (unless started with another)."""
        return link_token_file(self.link_work_dir)

    def start_link(
        self, *extra: str, database: str | None = None, work_dir: Path | None = None
    ) -> Server:
        """Start a link on free loopback ports, its state in ``database`` (default: a file),
        its work directory ``work_dir`` (default: ``link`` under the root)."""
        self.link_work_dir = work_dir or self.root / "link"
        self._link_flags = [
            "--database", database or str(self.root / "link.db"),
            "--work-dir", str(self.link_work_dir),
            *extra,
        ]  # fmt: skip
        return self._serve_link("127.0.0.1:0", "127.0.0.1:0")

    def restart_link(self) -> Server:
        """Start the link again as it was started (after a kill or a stop), with the fleet
        and control ports it had, as an operator's command line names them. The runtime
        port is left to the link, as the README's lines leave it: it keeps its own."""
        assert self.link is not None
        return self._serve_link(self.link.address("fleet"), self.link.address("control"))

    def _serve_link(self, fleet: str, control: str, *extra: str) -> Server:
        self.link = self._start(
            "link",
            [
                "--role", "link",
                "--fleet-address", fleet,
                "--control-address", control,
                "--heartbeat-patience", repr(self.heartbeat_patience),
                *extra,
                *self._link_flags,
            ],
        )  # fmt: skip
        return self.link

    def start_exec(self, *extra: str, link_exec: str | None = None) -> Server:
        """Start an exec launching the link's runs, through its exec API (or ``link_exec``).

        The link must serve the exec API: started with ``--exec-address`` and
        ``--exec-secret-file`` :attr:`exec_secret_file`.
        """
        assert self.link is not None
        index = sum(server.name.startswith("exec") for server in self.servers)
        return self._start(
            f"exec{index}",
            [
                "--role", "exec",
                "--link-exec", link_exec or self.link.address("exec"),
                "--exec-secret-file", str(self.exec_secret_file),
                "--work-dir", str(self.root / f"exec{index}"),
                *extra,
            ],
        )  # fmt: skip

    def start_node_exec(self, socket_path: Path, *extra: str) -> Server:
        """Start an exec that starts ClientApp processes for the nodes asking at ``socket_path``.

        A node uses it when started with ``"--exec-socket", str(socket_path),
        "--exec-secret-file", str(self.exec_secret_file)``.
        """
        index = sum(server.name.startswith("exec") for server in self.servers)
        return self._start(
            f"exec{index}",
            [
                "--role", "exec",
                "--exec-socket", str(socket_path),
                "--exec-secret-file", str(self.exec_secret_file),
                *extra,
            ],
        )  # fmt: skip

    def start_node(self, node_config: str, *extra: str, user: int | None = None) -> Server:
        """Start a node connected to the link, with ``node_config`` (as the user whose uid
        is ``user``, its primary group, if given: this process must be root)."""
        assert self.link is not None
        index = sum(server.name.startswith("node") for server in self.servers)
        return self._start(
            f"node{index}",
            [
                "--role", "node",
                "--link", self.link.address("fleet"),
                "--node-config", node_config,
                "--heartbeat-interval", repr(self.heartbeat_interval),
                "--work-dir", str(self.root / f"node{index}"),
                *extra,
            ],
            user=user,
        )  # fmt: skip

    def _start(self, name: str, args: list[str], user: int | None = None) -> Server:
        ready = self.root / f"{name}-{len(self.servers)}.ready"
        output = self.root / f"{name}-{len(self.servers)}.out"
        command = [str(FEDCORE)] if self.python is None else [str(self.python), "-c", _CLI]
        with output.open("wb") as sink:
            process = subprocess.Popen(
                [*command, "serve", *args, "--ready-file", str(ready)],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, **self.environment},
                user=user,
                group=None if user is None else pwd.getpwuid(user).pw_gid,
                extra_groups=None if user is None else (),
            )
        server = Server(name, process, output)
        self.servers.append(server)

        def started() -> bool:
            if ready.exists():
                return True
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{server.tail()}")
            return False

        wait_until(
            started, READY_DEADLINE, lambda: f"{name} ready:\n{server.tail()}", interval=0.02
        )
        pid, server.listeners = read_ready_file(ready)
        assert pid == process.pid
        return server

    def wait_for_file(self, path: Path, deadline: float = READY_DEADLINE) -> None:
        """Wait until ``path`` exists (a marker an app leaves), or raise after ``deadline`` s."""
        wait_until(path.exists, deadline, f"{path} to appear", interval=0.01)

    def kill(self, server: Server) -> None:
        """SIGKILL ``server`` and wait for it."""
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=30)

    def interrupt(self, server: Server, grace: float = 10.0) -> None:
        """Ctrl-C ``server`` (SIGINT), then SIGKILL after ``grace`` seconds."""
        self.stop(server, grace, signal.SIGINT)

    def stop(
        self, server: Server, grace: float = 10.0, signum: signal.Signals = signal.SIGTERM
    ) -> None:
        """SIGTERM ``server`` (or ``signum``), then SIGKILL after ``grace`` seconds."""
        if server.process.poll() is None:
            server.process.send_signal(signum)
            try:
                server.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill(server)

    def stop_all(self, servers: Iterable[Server], grace: float = 10.0) -> None:
        """SIGTERM each of ``servers`` at once, then SIGKILL those still up ``grace`` s later."""
        running = [server for server in servers if server.process.poll() is None]
        for server in running:
            server.process.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + grace
        for server in running:
            try:
                server.process.wait(timeout=max(give_up - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self.kill(server)

    def cli_environment(self, *, token: bool = True) -> dict[str, str]:
        """The environment of a ``fedcore`` command against the link: its control address
        in ``$FEDCORE_LINK`` and (unless ``token`` is false) its token in
        ``$FEDCORE_CONTROL_TOKEN``; without, no ``$FEDCORE_CONTROL_TOKEN`` at all."""
        environment = dict(os.environ)
        environment.pop(TOKEN_ENV, None)
        if self.link is not None:
            environment["FEDCORE_LINK"] = self.link.address("control")
            if token and self.control_token_file.exists():
                environment[TOKEN_ENV] = self.control_token_file.read_text().strip()
        return environment

    def fedcore(
        self,
        *args: str,
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
        token: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a ``fedcore`` command (against the link's control API, once there is a link),
        in the deployment's root, with :meth:`cli_environment`.

        ``env`` adds to (or overrides) that environment.
        """
        return subprocess.run(
            [str(FEDCORE), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.cli_environment(token=token), **(env or {})},
            cwd=self.root,
            check=False,
        )

    def submit(self, app_dir: Path, **config: object) -> str:
        """``fedcore run APP_DIR --run-config …`` (values as :func:`run_config_text` writes
        them); the new run's id."""
        submitted = self.fedcore("run", str(app_dir), "--run-config", run_config_text(config))
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip()

    def follow(self, run_id: str) -> tuple[dict[str, Any], list[str]]:
        """``fedcore log RUN_ID --follow --json`` to the run's end: the run as it ended, and
        the text of each of its log lines."""
        followed = self.fedcore("log", run_id, "--follow", "--json")
        assert followed.returncode == 0, followed.stderr
        *lines, final = [json.loads(line) for line in followed.stdout.splitlines()]
        return final, [line["text"] for line in lines]

    def follow_printed(self, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """:meth:`follow`, with the JSON objects the ServerApp printed (one a line) instead
        of every line: what the test apps report."""
        final, lines = self.follow(run_id)
        return final, printed_objects(lines)


def printed_objects(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects among a run's log lines (what the test apps print, one a line)."""
    return [json.loads(line) for line in lines if line.startswith("{")]


def run_config_text(config: Mapping[str, object]) -> str:
    """``--run-config`` text setting ``config``: each value written as JSON, which TOML reads
    alike for the numbers, strings and booleans of a run config."""
    return " ".join(f"{key}={json.dumps(value)}" for key, value in config.items())


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM, as a SystemExit that unwinds through ``Deployment.__exit__`` (status 143)."""
    raise SystemExit(128 + signum)
