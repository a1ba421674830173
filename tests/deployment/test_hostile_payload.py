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
import anyio.to_thread
import pytest

from fedcore.domain import Message, MetricRecord, RecordDict
from fedcore.domain.fleet import Digest, PayloadRef
from fedcore.errors import DecodeError
from fedcore.testing.deployment import Deployment
from fedcore.transport.grpc.client import GrpcFleetClient

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
MiB = 1024 * 1024
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


def _resident_memory(pid: int) -> int:
    """The process's resident memory now, in bytes (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _stalls(deployment: Deployment) -> int:
    """How many times the link's loop has woken more than 100 ms late since it started."""
    histogram = _control_get(deployment, "/v1/metrics")["loop_lag_histogram_ms"]
    assert isinstance(histogram, dict)
    return sum(histogram[bucket] for bucket in ("le_500", "le_1000", "le_5000", "more"))


class _Watch(threading.Thread):
    """Watches the link while it decodes a reply: calls its control API over and over
    (the slowest answer), samples its resident memory (the most above where it began),
    and counts its loop's stalls over 100 ms."""

    def __init__(self, deployment: Deployment) -> None:
        super().__init__(daemon=True)
        self._deployment = deployment
        assert deployment.link is not None
        self._pid = deployment.link.process.pid
        self.stop = threading.Event()
        self._watching = threading.Event()
        self._baseline = 0
        self._stalls_before = 0
        self.slowest_call = 0.0
        self.most_memory = 0
        self.stalls = 0
        self.calls = 0

    def begin(self) -> None:
        self._stalls_before = _stalls(self._deployment)
        self._baseline = _resident_memory(self._pid)
        self._watching.set()

    def end(self) -> None:
        self._watching.clear()
        self.stalls += _stalls(self._deployment) - self._stalls_before

    def run(self) -> None:
        sampler = threading.Thread(target=self._sample_memory, daemon=True)
        sampler.start()
        while not self.stop.is_set():
            if not self._watching.wait(0.05):
                continue
            started = time.monotonic()
            _control_get(self._deployment, "/v1/metrics")
            self.slowest_call = max(self.slowest_call, time.monotonic() - started)
            self.calls += 1
        sampler.join()

    def _sample_memory(self) -> None:
        """Every 10 ms while watching: apart from the control calls, which a held loop
        would hold up until the memory is freed again."""
        while not self.stop.is_set():
            if self._watching.wait(0.05):
                grown = _resident_memory(self._pid) - self._baseline
                self.most_memory = max(self.most_memory, grown)
                self.stop.wait(0.01)


async def _attack(port: int, sizes: tuple[int, ...], watch: _Watch) -> list[str]:
    """Join as a node, take the round's message, push each hostile payload and a reply
    naming it (``watch`` watching the link while it decodes), then answer properly;
    the reasons the link gave for refusing."""
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
                await anyio.to_thread.run_sync(watch.begin)
                with pytest.raises(DecodeError) as refused:
                    await client.push_reply(node_id, reply, PayloadRef(payload_id, digest))
                await anyio.to_thread.run_sync(watch.end)
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
        watch = _Watch(deployment)
        watch.start()
        try:
            refusals = anyio.run(_attack, link.listeners["fleet"].port, (8 * MiB, 48 * MiB), watch)
        finally:
            watch.stop.set()
            watch.join(timeout=30)
        final, replies = deployment.follow_printed(run_id)

    harm = (
        f"{watch.stalls} loop stalls over 100 ms, slowest control call "
        f"{watch.slowest_call:.2f} s, resident memory up to +{watch.most_memory // MiB} MiB"
    )
    assert watch.stalls == 0, harm
    assert watch.slowest_call < CONTROL_CALL_LIMIT, harm
    assert watch.most_memory < MEMORY_LIMIT, harm
    assert watch.calls > 0
    assert len(refusals) == 2
    for refusal in refusals:
        assert "its header decodes to more than" in refusal, refusal
    assert final["status"] == "finished:completed", final
    assert sorted((reply["partition"], reply["code"]) for reply in replies) == [
        (0, None),
        (1, None),
    ], replies
