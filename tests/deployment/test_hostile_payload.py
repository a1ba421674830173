"""A node that amplifies through its reply's payload: a header of empty msgpack lists.

A node holding a leased message may push a payload of any size up to the link's cap,
then a reply naming it. Each empty msgpack list is one byte on the wire and 64 in
Python; the link must refuse such a header after a bounded count of objects, decode
it off the event loop, and go on serving the run beside it. The hostile node here is
this test process, speaking the fleet API with fedcore's own client (signed with its
own key); the link and the honest node are ``fedcore serve`` processes.
"""

from __future__ import annotations

import json
import struct
import threading
import time
import urllib.request
from pathlib import Path

import anyio
import pytest

from fedcore.domain import Message, MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.testing.deployment import Deployment
from fedcore.transport.grpc.client import GrpcFleetClient
from fedcore.wire.chunks import Digest
from fedcore.wire.fleet import PayloadRef

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
MiB = 1024 * 1024
LAG_LIMIT_MS = 100.0
CONTROL_CALL_LIMIT = 1.0
MEMORY_LIMIT = 100 * MiB
pytestmark = pytest.mark.timeout(120)


def _empty_lists_payload(size: int, per_list: int = 60_000) -> bytes:
    """A RecordDict payload of about ``size`` bytes whose header is all empty lists."""
    lists = [per_list] * (size // (per_list + 5))
    header = b"\xdd" + struct.pack(">I", len(lists))
    header += b"".join(b"\xdd" + struct.pack(">I", count) + b"\x90" * count for count in lists)
    return b"FCR\x01" + struct.pack(">I", len(header)) + header


def _control_get(deployment: Deployment, path: str) -> dict[str, object]:
    assert deployment.link is not None
    url = f"http://{deployment.link.address('control')}{path}"
    token = deployment.control_token_file.read_text().strip()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, object] = json.load(response)
    return document


def _peak_memory(pid: int) -> int:
    """The most resident memory the process has had, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


class _ControlCalls(threading.Thread):
    """Calls the link's control API over and over, noting the slowest answer."""

    def __init__(self, deployment: Deployment) -> None:
        super().__init__(daemon=True)
        self._deployment = deployment
        self.stop = threading.Event()
        self.slowest = 0.0
        self.calls = 0

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            _control_get(self._deployment, "/v1/metrics")
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.calls += 1
            self.stop.wait(0.02)


async def _attack(port: int, sizes: tuple[int, ...]) -> list[str]:
    """Join as a node, take the round's message, push each hostile payload and a reply
    naming it, then answer properly; the reasons the link gave for refusing."""
    refusals = []
    # Made before joining: making them takes this process's loop from its heartbeats.
    payloads = [(data, Digest.of(data)) for data in map(_empty_lists_payload, sizes)]
    async with GrpcFleetClient("127.0.0.1", port) as client:
        node_id = await client.register_node({}, 1.0, client.key.public.der)
        async with anyio.create_task_group() as beats:

            async def beat() -> None:
                while True:
                    await client.heartbeat(node_id, 1.0)
                    await anyio.sleep(0.3)

            beats.start_soon(beat)
            with anyio.fail_after(60):
                pulled = await client.pull_messages(node_id, lease_seconds=60, wait_seconds=5)
                while not pulled.messages:
                    pulled = await client.pull_messages(node_id, lease_seconds=60, wait_seconds=5)
            message = pulled.messages[0].message
            message_id = message.metadata.message_id
            for data, digest in payloads:
                payload_id = await client.push_payload(node_id, message_id, digest, [data])
                reply = Message(RecordDict(), reply_to=message)
                with pytest.raises(DecodeError) as refused:
                    await client.push_reply(node_id, reply, PayloadRef(payload_id, digest))
                refusals.append(str(refused.value))
            answer = RecordDict({"metrics": MetricRecord({"partition": 1})})
            await client.push_reply(node_id, Message(answer, reply_to=message))
            beats.cancel_scope.cancel()
    return refusals


def test_a_payload_of_empty_lists_is_refused_off_the_loop_beside_a_run(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0, heartbeat_patience=2.0) as deployment:
        link = deployment.start_link(database=":memory:")
        deployment.start_node("partition-id=0")
        run_id = deployment.submit(CHAOS_APP, rounds=1, **{"min-nodes": 2})
        memory_before = _peak_memory(link.process.pid)
        calls = _ControlCalls(deployment)
        calls.start()
        try:
            refusals = anyio.run(_attack, link.listeners["fleet"].port, (8 * MiB, 48 * MiB))
        finally:
            calls.stop.set()
            calls.join(timeout=30)
        grown = _peak_memory(link.process.pid) - memory_before
        lag = _control_get(deployment, "/v1/metrics")["loop_lag_max_ms"]
        final, replies = deployment.follow_printed(run_id)

    assert isinstance(lag, dict)
    harm = f"loop lag {lag}, slowest control call {calls.slowest:.2f} s, grew {grown // MiB} MiB"
    assert lag["since_start"] < LAG_LIMIT_MS, harm
    assert calls.slowest < CONTROL_CALL_LIMIT, harm
    assert grown < MEMORY_LIMIT, harm
    assert calls.calls > 0
    assert len(refusals) == 2
    for refusal in refusals:
        assert "its header decodes to more than" in refusal, refusal
    assert final["status"] == "finished:completed", final
    assert sorted((reply["partition"], reply["code"]) for reply in replies) == [
        (0, None),
        (1, None),
    ], replies
