"""What a stranger costs a real link's HTTP APIs: requests sent half-way, and a flood of them.

Each test runs ``fedcore serve --role link`` as a process and opens raw sockets to
its control, runtime and exec APIs from this process: no token is needed to hold a
connection open half-way through a request's headers (slowloris).
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import time
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

pytestmark = pytest.mark.timeout(180)

TRICKLE_SECONDS = 0.5
"""How often a slow sender adds a byte or a header line, as slowloris does."""


def _connect(deployment: Deployment, listener: str) -> socket.socket:
    assert deployment.link is not None
    address = deployment.link.listeners[listener]
    return socket.create_connection((address.host, address.port), timeout=10)


def _closed_after(
    sockets: dict[str, tuple[socket.socket, bytes]], give_up: float
) -> dict[str, float | None]:
    """Seconds until the link closed each socket (None: still open after ``give_up`` s),
    each sent its ``bytes`` every :data:`TRICKLE_SECONDS` meanwhile (none for b"")."""
    started = time.monotonic()
    closed: dict[str, float | None] = dict.fromkeys(sockets)
    for sock, _ in sockets.values():
        sock.setblocking(False)
    while time.monotonic() - started < give_up and None in closed.values():
        for name, (sock, trickle) in sockets.items():
            if closed[name] is not None:
                continue
            try:
                if sock.recv(65536) == b"":
                    closed[name] = time.monotonic() - started
                    continue
            except BlockingIOError:
                pass  # nothing from the link: still open
            except OSError:  # reset by the link
                closed[name] = time.monotonic() - started
                continue
            with contextlib.suppress(OSError):  # a closed one is found at the next recv
                if trickle:
                    sock.send(trickle)
        time.sleep(TRICKLE_SECONDS)
    return closed


def test_requests_sent_half_way_are_closed_within_their_timeouts(tmp_path: Path) -> None:
    with Deployment(tmp_path) as deployment:
        deployment.start_link(
            "--exec-address", "127.0.0.1:0",
            "--exec-secret-file", str(deployment.exec_secret_file),
            "--http-header-timeout", "1",
            "--http-body-timeout", "1",
            "--http-idle-timeout", "1",
            database=":memory:",
        )  # fmt: skip
        token = deployment.control_token_file.read_text().strip()
        header_line = b"X-Slow: 1\r\n"
        sent = {
            "control headers": (
                "control",
                b"GET /v1/health HTTP/1.1\r\nHost: link\r\n",
                header_line,
            ),
            "runtime headers": ("runtime", b"GET /v1/runtime/run HTTP/1.1\r\n", header_line),
            "exec headers": ("exec", b"GET /v1/exec/link HTTP/1.1\r\nHost: link\r\n", header_line),
            "control body": (
                "control",
                b"POST /v1/nodes/authorized HTTP/1.1\r\nHost: link\r\n"
                b"Authorization: Bearer " + token.encode() + b"\r\n"
                b"Content-Length: 1000\r\n\r\nssh-ed25519 ",
                b"A",
            ),
            "runtime idle": ("runtime", b"", b""),
        }
        sockets = {}
        for name, (listener, first, trickle) in sent.items():
            sock = _connect(deployment, listener)
            sock.sendall(first)
            sockets[name] = (sock, trickle)
        try:
            closed = _closed_after(sockets, give_up=15)
        finally:
            for sock, _ in sockets.values():
                sock.close()
        assert all(seconds is not None and seconds < 6 for seconds in closed.values()), closed
        health = deployment.fedcore("ls", "--nodes", "--json", timeout=30)
        assert health.returncode == 0, health.stderr


@pytest.mark.parametrize(
    "listeners", [["control"], ["runtime"], ["fleet", "control"]], ids="+".join
)
def test_a_thousand_half_sent_requests_block_neither_registration_nor_ls(
    tmp_path: Path, low_fd_limit: None, listeners: list[str]
) -> None:
    """Half-sent requests (idle HTTP/2 connections on the fleet port), taken in turns by
    ``listeners``: together they must stay under the one open-file limit as well."""
    with Deployment(tmp_path) as deployment:
        # Headers may take ten minutes: the connection caps alone must keep the link whole.
        deployment.start_link("--http-header-timeout", "600", database=":memory:")
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        half_sent = []
        try:
            for index in range(1000):
                listener = listeners[index % len(listeners)]
                sock = _connect(deployment, listener)
                half_sent.append(sock)
                if listener != "fleet":
                    with contextlib.suppress(OSError):  # closed by the link to make room
                        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: link\r\n")
            deployment.start_node("partition-id=0")
            listed = deployment.fedcore("ls", "--nodes", "--json", timeout=30)
            assert listed.returncode == 0, listed.stderr
            assert len(json.loads(listed.stdout)) == 1, listed.stdout
        finally:
            for sock in half_sent:
                sock.close()
