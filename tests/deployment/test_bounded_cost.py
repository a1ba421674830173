"""What a stranger costs a real link: hostile frames, idle sockets, stalled bodies, garbage.

Each test runs ``fedcore serve --role link`` (and nodes) as processes and attacks its
fleet port from this process, unregistered and unsigned; the link's own lag monitor
(``GET /v1/metrics``) says how long its event loop was held.
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.const import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.testing.deployment import Deployment
from fedcore.testing.stranger import raw_fleet_call
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.rpc import FleetMethod

SLOW_APP = Path(__file__).resolve().parent / "slow_app"
LAG_LIMIT_MS = 100.0
GIVE_UP = 5.0
pytestmark = pytest.mark.timeout(180)


def _metrics(deployment: Deployment) -> dict[str, Any]:
    assert deployment.link is not None
    url = f"http://{deployment.link.address('control')}/v1/metrics"
    token = deployment.control_token_file.read_text().strip()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return document


async def _call(
    port: int, method: FleetMethod, data: bytes, *, end: bool = True, signed: bool = True
) -> Status:
    """The status a raw call of ``method`` with ``data`` (framed already) ends with."""
    error = await raw_fleet_call(port, method, data, end=end, signed=signed)
    return Status.OK if error is None else error.status


def _framed(body: bytes) -> bytes:
    return struct.pack(">?I", False, len(body)) + body


def _hostile_registration(size: int) -> bytes:
    return _framed(b"\x0a\x00" * (size // 2))  # empty config entries


def _hostile_reply(size: int) -> bytes:
    """A PushReply whose inline content is a msgpack header of empty lists (amplification)."""
    lists = size - 64
    header = b"\xdd" + struct.pack(">I", lists) + b"\x90" * lists
    content = b"FCR\x01" + struct.pack(">I", len(header)) + header
    metadata = pb.Metadata(
        run_id=1,
        message_id="r1",
        src_node_id=1,
        reply_to_message_id="m1",
        created_at=time.time(),
        ttl=3600.0,
        message_type="train",
    )
    return _framed(
        bytes(pb.PushReplyRequest(node_id=1, reply=pb.Message(metadata=metadata, content=content)))
    )


def _port(deployment: Deployment) -> int:
    assert deployment.link is not None
    return deployment.link.listeners["fleet"].port


def test_hostile_registrations_and_replies_leave_a_run_and_the_loop_untouched(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0, heartbeat_patience=2.0) as deployment:
        deployment.start_link(database=":memory:")
        for index in range(2):
            deployment.start_node(f"partition-id={index}")
        run_id = deployment.submit(
            SLOW_APP, rounds=2, **{"min-nodes": 2, "block-seconds": 0.0, "train-seconds": 0.2}
        )
        port = _port(deployment)

        async def attack() -> list[Status]:
            statuses = []
            for size in (256 * 1024, 8 * 1024 * 1024 - 16):
                for method, frame in (
                    (FleetMethod.REGISTER_NODE, _hostile_registration(size)),
                    (FleetMethod.PUSH_REPLY, _hostile_reply(size)),
                ):
                    # A refused sender of 8 MiB may stay blocked on flow control: it gives up.
                    with anyio.move_on_after(GIVE_UP):
                        statuses.append(await _call(port, method, frame))
            return statuses

        statuses = anyio.run(attack)
        lag = _metrics(deployment)["loop_lag_max_ms"]  # the run goes on: read it now
        assert Status.OK not in statuses
        assert Status.INTERNAL not in statuses
        assert lag["since_start"] < LAG_LIMIT_MS, lag
        final, replies = deployment.follow_printed(run_id)
        assert final["status"] == "finished:completed", final
        assert [reply["code"] for reply in replies] == [None] * 4, replies


def test_a_thousand_idle_sockets_block_neither_registration_nor_ls(
    tmp_path: Path, low_fd_limit: None
) -> None:
    with Deployment(tmp_path) as deployment:
        deployment.start_link(database=":memory:")
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        idle = []
        try:
            for _ in range(1000):
                idle.append(socket.create_connection(("127.0.0.1", _port(deployment)), timeout=5))
            deployment.start_node("partition-id=0")
            listed = deployment.fedcore("ls", "--nodes", "--json", timeout=30)
            assert listed.returncode == 0, listed.stderr
            assert len(json.loads(listed.stdout)) == 1, listed.stdout
        finally:
            for sock in idle:
                sock.close()


def test_a_stalled_request_and_an_idle_connection_are_closed(tmp_path: Path) -> None:
    with Deployment(tmp_path) as deployment:
        deployment.start_link(
            "--fleet-body-timeout", "0.5", "--fleet-idle-timeout", "1", database=":memory:"
        )  # fmt: skip
        port = _port(deployment)

        async def stall() -> Status:
            with anyio.fail_after(10):
                partial = struct.pack(">?I", False, 100) + b"\x08\x01"
                return await _call(port, FleetMethod.REGISTER_NODE, partial, end=False)

        assert anyio.run(stall) is Status.INVALID_ARGUMENT
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
            idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            started = time.monotonic()
            while idle.recv(65536):
                pass  # the link's SETTINGS, then the end of the stream
            assert time.monotonic() - started < 8


@pytest.fixture(scope="module")
def fuzzed_link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(tmp_path_factory.mktemp("fuzz")) as deployment:
        deployment.start_link(database=":memory:")
        yield deployment


@settings(
    max_examples=80,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    method=st.sampled_from(list(FleetMethod)), body=st.binary(max_size=300), signed=st.booleans()
)
def test_garbage_to_every_method_is_refused_never_internal(
    fuzzed_link: Deployment, method: FleetMethod, body: bytes, signed: bool
) -> None:
    port = _port(fuzzed_link)

    async def send() -> Status:
        with anyio.fail_after(10):
            return await _call(port, method, _framed(body), signed=signed)

    status = anyio.run(send)
    assert status not in (Status.INTERNAL, Status.UNKNOWN, Status.UNAVAILABLE), status
    if not signed:
        assert status is Status.UNAUTHENTICATED
    assert fuzzed_link.link is not None
    assert fuzzed_link.link.process.poll() is None
