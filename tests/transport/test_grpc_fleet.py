"""The fleet API over gRPC on loopback: calls round-trip, errors map both ways, bad input fails."""

from __future__ import annotations

import gc
import hashlib
import logging
import struct
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from fedcore.auth.fleet_gate import Admission, NodeGate
from fedcore.auth.sessions import MacRequest
from fedcore.clock import SystemClock
from fedcore.domain import Error, ErrorCode, Message, Run, RunStatus
from fedcore.domain.fleet import Digest, PayloadRef
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import (
    AuthenticationError,
    ConflictError,
    DecodeError,
    FedcoreError,
    LinkUnavailableError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet
from fedcore.testing.network import closed_port
from fedcore.testing.stranger import raw_fleet_call
from fedcore.transport.fleet import Buffer, Transfer
from fedcore.transport.grpc import GrpcFleetClient, serve_fleet
from fedcore.wire import rpc as wire
from fedcore.wire import unpack_recorddict
from fedcore.wire.chunks import CHUNK_SIZE
from fedcore.wire.protobuf import FRAME_CAP
from fedcore.wire.rpc import REQUEST_CAPS, FleetMethod

pytestmark = pytest.mark.anyio

RUN_ID = 7
MiB = 1 << 20


@asynccontextmanager
async def connected(fleet: FakeFleet) -> AsyncIterator[tuple[GrpcFleetClient, int]]:
    """A client talking to ``fleet`` through a gRPC server on 127.0.0.1, and the server's port."""
    async with (
        serve_fleet(fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock())) as listener,
        GrpcFleetClient(listener.host, listener.port) as client,
    ):
        assert listener.port > 0
        yield client, listener.port


def message_for(node_id: int, content: RecordDict | None = None) -> Message:
    content = content or RecordDict({"config": ConfigRecord({"lr": 0.5})})
    return Message(content, node_id, "train", group_id="round-1", ttl=600)


def sha256(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


async def collect(transfer: AbstractAsyncContextManager[Transfer]) -> tuple[Digest, bytes]:
    async with transfer as t:
        return t.digest, b"".join([bytes(data) async for data in t.chunks])


def fake_with_run(clock: FakeClock | None = None, bundle: bytes = b"bundle") -> FakeFleet:
    fleet = FakeFleet(clock)
    fleet.add_run(
        Run(RUN_ID, {"num-server-rounds": 3, "tag": "x"}, RunStatus.RUNNING, seed=5), bundle
    )
    return fleet


# ------------------------------------------------------------------- round trips


async def test_nodes_register_heartbeat_and_unregister() -> None:
    fleet = fake_with_run()
    config = {"partition-id": 0, "num-partitions": 2, "name": "a", "fast": True, "lr": 0.1}
    async with connected(fleet) as (client, _):
        node_id = await client.register_node(config, 1.5)
        assert fleet.nodes[node_id].node_config == config
        assert list(fleet.nodes[node_id].node_config) == list(config)
        assert fleet.nodes[node_id].heartbeat_interval == 1.5

        assert await client.heartbeat(node_id, 4.0) == []
        assert fleet.nodes[node_id].heartbeat_interval == 4.0

        await client.unregister_node(node_id)
        assert node_id not in fleet.nodes
        await client.unregister_node(node_id)  # a retry after a lost response is harmless
        with pytest.raises(NodeNotFoundError, match="register again"):
            await client.heartbeat(node_id, 1.0)


async def test_messages_are_leased_replied_to_and_deduplicated() -> None:
    clock = FakeClock()
    fleet = fake_with_run(clock)
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        weights = np.arange(12, dtype=np.float32).reshape(3, 4)
        content = RecordDict({"arrays": ArrayRecord({"w": weights})})
        first = fleet.send(RUN_ID, message_for(node_id, content))
        second = fleet.send(RUN_ID, message_for(node_id))

        pulled = await client.pull_messages(node_id, limit=5, lease_seconds=20)
        assert pulled.now == clock.now()
        assert [leased.message.metadata.message_id for leased in pulled.messages] == [first, second]
        leased = pulled.messages[0]
        assert leased.lease_expires_at == clock.now() + 20
        assert leased.payload is None
        assert leased.message.metadata.run_id == RUN_ID
        assert leased.message.metadata.group_id == "round-1"
        np.testing.assert_array_equal(leased.message.content["arrays"]["w"], weights)
        # leased: not handed out again until the lease runs out
        assert (await client.pull_messages(node_id)).messages == ()

        # a heartbeat keeps a lease; an unknown id is released
        assert await client.heartbeat(node_id, 1.0, [first, "nope"], 100) == ["nope"]
        clock.advance(50)  # the second's 20 s lease ran out, the first's was extended to 100 s
        back = await client.pull_messages(node_id, limit=5)
        assert [m.message.metadata.message_id for m in back.messages] == [second]
        clock.advance(60)
        again = await client.pull_messages(node_id, limit=5)
        assert [m.message.metadata.message_id for m in again.messages] == [first, second]

        reply = Message(
            RecordDict({"metrics": MetricRecord({"loss": 0.25})}), reply_to=leased.message
        )
        pushed = await client.push_reply(node_id, reply)
        assert not pushed.duplicate
        stored = fleet.replies[first].reply
        assert stored.metadata.message_id == pushed.reply_id
        assert stored.metadata.src_node_id == node_id
        assert stored.content["metrics"]["loss"] == 0.25

        retry = await client.push_reply(node_id, reply)
        assert retry.duplicate
        assert retry.reply_id == pushed.reply_id
        different = Message(
            RecordDict({"metrics": MetricRecord({"loss": 0.5})}), reply_to=leased.message
        )
        with pytest.raises(ConflictError, match="different reply"):
            await client.push_reply(node_id, different)

        failed = Message(
            error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"),
            reply_to=again.messages[1].message,
        )
        assert not (await client.push_reply(node_id, failed)).duplicate
        assert fleet.replies[second].reply.error == Error(2, "boom")


async def test_get_run_and_its_bundle() -> None:
    bundle = np.random.default_rng(0).bytes(3 * MiB + 17)
    fleet = fake_with_run(bundle=bundle)
    fleet.chunk_size = MiB
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        with pytest.raises(RunNotFoundError):  # no message of the run yet: not this node's
            await client.get_run(node_id, RUN_ID)
        fleet.send(RUN_ID, message_for(node_id))

        run, digest = await client.get_run(node_id, RUN_ID)
        assert run == Run(RUN_ID, {"num-server-rounds": 3, "tag": "x"}, RunStatus.RUNNING, seed=5)
        assert digest == Digest(len(bundle), sha256(bundle))

        got_digest, got = await collect(client.get_bundle(node_id, RUN_ID))
        assert got_digest == digest
        assert sha256(got) == sha256(bundle)


async def test_a_payload_larger_than_a_chunk_travels_both_ways() -> None:
    fleet = fake_with_run()
    big = np.random.default_rng(1).standard_normal(20 * MiB // 8)  # 20 MiB of float64
    assert big.nbytes > 2 * CHUNK_SIZE
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        message_id = fleet.send(
            RUN_ID, message_for(node_id, RecordDict({"a": ArrayRecord({"w": big})}))
        )

        (leased,) = (await client.pull_messages(node_id)).messages
        assert leased.payload is not None
        assert len(leased.message.content) == 0  # the content is the payload, fetched next
        digest, data = await collect(client.pull_payload(node_id, leased.payload.payload_id))
        assert digest == leased.payload.digest
        assert sha256(data) == digest.sha256
        content = unpack_recorddict(data)
        assert sha256(content["a"]["w"].tobytes()) == sha256(big.tobytes())

        answer = (big * 2).tobytes()
        answer_digest = Digest(len(answer), sha256(answer))
        payload_id = await client.push_payload(node_id, message_id, answer_digest, [answer])
        stored = fleet.payloads[payload_id]
        assert len(stored.parts) == -(-len(answer) // CHUNK_SIZE)
        assert sha256(b"".join(stored.parts)) == sha256(answer)

        reply = Message(RecordDict(), reply_to=leased.message)
        ref = PayloadRef(payload_id, answer_digest)
        assert not (await client.push_reply(node_id, reply, ref)).duplicate
        assert fleet.replies[message_id].payload == ref
        assert (await client.push_reply(node_id, reply, ref)).duplicate


async def test_memory_stays_within_a_few_chunks_whatever_the_payload_size() -> None:
    fleet = fake_with_run()
    fleet.chunk_size = MiB
    payload = np.random.default_rng(2).bytes(24 * MiB)
    digest = Digest(len(payload), sha256(payload))
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        message_id = fleet.send(RUN_ID, message_for(node_id))
        pieces = (memoryview(payload)[start : start + MiB] for start in range(0, len(payload), MiB))

        gc.collect()
        tracemalloc.start()
        payload_id = await client.push_payload(node_id, message_id, digest, pieces)
        _, push_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        kept, _ = tracemalloc.get_traced_memory()
        hasher = hashlib.sha256()
        async with client.pull_payload(node_id, payload_id) as transfer:
            async for data in transfer.chunks:
                hasher.update(data)
        _, pull_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

    assert hasher.digest() == digest.sha256
    # The fake keeps the pushed payload (24 MiB); beyond that, both directions hold
    # a few 1 MiB chunks and the 4 MiB HTTP/2 window, never the whole payload.
    assert kept >= len(payload)
    assert push_peak - kept < 12 * MiB, push_peak - kept
    assert pull_peak - kept < 12 * MiB, pull_peak - kept


async def test_long_poll_returns_as_soon_as_a_message_arrives() -> None:
    fleet = fake_with_run()
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        got = []

        async def pull() -> None:
            started = time.monotonic()
            pulled = await client.pull_messages(node_id, wait_seconds=30)
            got.append((time.monotonic() - started, pulled))

        async with anyio.create_task_group() as tg:
            tg.start_soon(pull)
            await anyio.sleep(0.2)
            assert got == []  # still waiting
            message_id = fleet.send(RUN_ID, message_for(node_id))
        ((elapsed, pulled),) = got
        assert [m.message.metadata.message_id for m in pulled.messages] == [message_id]
        assert elapsed < 1.0  # woken by the message, not by the 30 s wait running out

        started = time.monotonic()
        assert (await client.pull_messages(node_id, wait_seconds=0.2)).messages == ()
        assert 0.15 < time.monotonic() - started < 2.0


# ------------------------------------------------------------------- errors, both ways


async def test_lookup_errors_come_back_as_the_same_class() -> None:
    fleet = fake_with_run()
    async with connected(fleet) as (client, _):
        with pytest.raises(NodeNotFoundError, match="no node has registered"):
            await client.pull_messages(5)
        node_id = await client.register_node({}, 1.0)
        with pytest.raises(RunNotFoundError, match="no run 99"):
            await client.get_run(node_id, 99)
        with pytest.raises(RunNotFoundError):
            await collect(client.get_bundle(node_id, 99))
        with pytest.raises(MessageNotFoundError, match="no open message"):
            await client.push_payload(node_id, "nope", Digest(1, sha256(b"x")), [b"x"])
        # refused while the client is still sending: the status comes with the reset
        big = bytes(3 * CHUNK_SIZE)
        with pytest.raises(MessageNotFoundError, match="no open message"):
            await client.push_payload(node_id, "nope", Digest(len(big), sha256(big)), [big])
        with pytest.raises(NotFoundError, match="no payload") as caught:
            await collect(client.pull_payload(node_id, "nope"))
        assert type(caught.value) is NotFoundError


async def test_rejected_replies_raise_their_reasons() -> None:
    clock = FakeClock()
    fleet = fake_with_run(clock)
    async with (
        connected(fleet) as (client, port),
        GrpcFleetClient("127.0.0.1", port) as second,  # another node: a key of its own
    ):
        node_id = await client.register_node({}, 1.0)
        other = await second.register_node({}, 1.0)
        assert await client.register_node({}, 1.0) == node_id, "one key, one node"
        fleet.send(RUN_ID, message_for(node_id))
        (leased,) = (await client.pull_messages(node_id)).messages
        reply = Message(RecordDict(), reply_to=leased.message)

        with pytest.raises(AuthenticationError, match="not node 4242's"):
            await client.push_reply(4242, reply)
        with pytest.raises(AuthenticationError, match=f"not node {other}'s"):
            await client.push_reply(other, reply)
        with pytest.raises(MessageNotFoundError, match="rejected"):
            await second.push_reply(other, reply)
        bogus = PayloadRef("nope", Digest(1, sha256(b"x")))
        with pytest.raises(DecodeError, match="not this reply's"):
            await client.push_reply(node_id, reply, bogus)
        clock.advance(601)
        with pytest.raises(ReplyRejectedError, match="expired"):
            await client.push_reply(node_id, reply)
        fleet.runs[RUN_ID][0].status = RunStatus.STOPPED
        with pytest.raises(RunFinishedError):
            await client.push_reply(node_id, reply)
        assert fleet.replies == {}


async def test_a_bad_request_from_the_client_is_refused_before_it_is_sent() -> None:
    async with connected(fake_with_run()) as (client, _):
        with pytest.raises(ValueError, match="heartbeat_interval"):
            await client.register_node({}, 0.0)
        with pytest.raises(TypeError, match="config key"):
            await client.register_node({"x": [1]}, 1.0)  # type: ignore[dict-item]


class Failing(FakeFleet):
    async def get_run(self, node_id: int, run_id: int) -> tuple[Run, Digest]:
        raise RuntimeError("secret at /srv/link/state.db")


async def test_an_unexpected_error_is_internal_with_no_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Failing()
    async with connected(fleet) as (client, _):
        node_id = await client.register_node({}, 1.0)
        with caplog.at_level(logging.ERROR), pytest.raises(FedcoreError) as caught:
            await client.get_run(node_id, 1)
        assert "INTERNAL" in str(caught.value)
        assert "secret" not in str(caught.value)
        assert "/srv" not in str(caught.value)
        assert not isinstance(caught.value, LinkUnavailableError | NotFoundError | DecodeError)
        logged = [r for r in caplog.records if r.name == "fedcore.transport.grpc.server"]
        assert logged
        assert logged[0].exc_info
        assert "secret" in str(logged[0].exc_info[1])
        assert await client.register_node({}, 1.0)  # still serving


# ------------------------------------------------------------------- hostile input


async def raw_status(
    port: int, method: FleetMethod, data: bytes, *, end: bool = True, signed: bool = True
) -> GRPCError:
    """The error status a raw call of ``method`` with ``data`` ends with (it must fail)."""
    error = await raw_fleet_call(port, method, data, end=end, signed=signed)
    assert error is not None, f"{method.name} answered OK to {data[:20]!r}"
    return error


@pytest.mark.parametrize("method", list(FleetMethod), ids=lambda m: m.name)
async def test_an_unsigned_call_to_each_method_is_unauthenticated_unread(
    method: FleetMethod,
) -> None:
    async with connected(fake_with_run()) as (client, port):
        node_id = await client.register_node({}, 1.0)
        # A well-formed request about a real node, from someone without its key.
        frame = wire.encode_get_run_request(node_id, RUN_ID)
        error = await raw_status(port, method, struct.pack(">?I", False, len(frame)) + frame,
                                 signed=False)  # fmt: skip
        assert error.status is Status.UNAUTHENTICATED, error
        assert "not signed" in (error.message or "")
        # Declares 1 GiB and sends a little: refused on the headers, before any of it is read.
        with anyio.fail_after(5):
            error = await raw_status(port, method, struct.pack(">?I", False, 1 << 30),
                                     end=False, signed=False)  # fmt: skip
        assert error.status is Status.UNAUTHENTICATED


@pytest.mark.parametrize("method", list(FleetMethod), ids=lambda m: m.name)
async def test_garbage_to_each_method_is_invalid_argument(method: FleetMethod) -> None:
    async with connected(fake_with_run()) as (client, port):
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05abc", b"\x08" + b"\xff" * 11):
            framed = struct.pack(">?I", False, len(garbage)) + garbage
            error = await raw_status(port, method, framed)
            assert error.status is Status.INVALID_ARGUMENT, error
            assert "Traceback" not in (error.message or "")
        truncated = await raw_status(port, method, struct.pack(">?I", False, 100) + b"\x08\x01")
        assert truncated.status is Status.INVALID_ARGUMENT
        assert await client.register_node({}, 1.0)


@pytest.mark.parametrize("method", list(FleetMethod), ids=lambda m: m.name)
async def test_an_oversized_frame_is_refused_unread_and_others_are_served(
    method: FleetMethod,
) -> None:
    async with connected(fake_with_run()) as (client, port):
        # Declares 1 GiB, sends 64 KiB and leaves the stream open: a server that
        # buffered before checking would wait for the rest and never answer.
        declared = struct.pack(">?I", False, 1 << 30) + b"\0" * 65536
        with anyio.fail_after(5):
            error = await raw_status(port, method, declared, end=False)
        assert error.status is Status.INVALID_ARGUMENT
        assert f"over the frame cap of {REQUEST_CAPS[method]}" in (error.message or "")
        assert await client.register_node({}, 1.0)


@pytest.mark.parametrize("method", list(FleetMethod), ids=lambda m: m.name)
async def test_each_method_refuses_a_frame_over_its_own_cap_unread(method: FleetMethod) -> None:
    cap = REQUEST_CAPS[method]
    assert cap <= FRAME_CAP
    async with connected(fake_with_run()) as (_, port):
        declared = struct.pack(">?I", False, cap + 1) + b"\0" * 1024
        with anyio.fail_after(5):
            error = await raw_status(port, method, declared, end=False)
        assert error.status is Status.INVALID_ARGUMENT
        assert f"a frame of {cap + 1} bytes is over the frame cap of {cap}" in (error.message or "")


async def test_nothing_listening_is_link_unavailable() -> None:
    port = closed_port()
    async with GrpcFleetClient("127.0.0.1", port) as client:
        with pytest.raises(LinkUnavailableError, match=f"127.0.0.1:{port}"):
            await client.register_node({}, 1.0)
        with pytest.raises(LinkUnavailableError):
            await collect(client.get_bundle(1, 1))


async def test_a_link_that_goes_away_mid_call_is_link_unavailable() -> None:
    fleet = fake_with_run()
    server = serve_fleet(fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock()))
    listener = await server.__aenter__()
    async with GrpcFleetClient(listener.host, listener.port) as client:
        node_id = await client.register_node({}, 1.0)
        async with anyio.create_task_group() as tg:
            failures = []

            async def pull() -> None:
                try:
                    await client.pull_messages(node_id, wait_seconds=30)
                except LinkUnavailableError as exc:
                    failures.append(exc)

            tg.start_soon(pull)
            await anyio.sleep(0.2)
            with anyio.fail_after(5):
                await server.__aexit__(None, None, None)
        assert len(failures) == 1


class _Recording(NodeGate):
    """The link's gate, noting each call it was asked to admit: its method and how it was
    authenticated (``!link``: signed for a name other than the gate's, so refused)."""

    def __init__(self, fleet: FakeFleet) -> None:
        super().__init__(fleet, SystemClock())
        self.presented: list[tuple[str, str]] = []

    async def admit(self, method: str, frame: Buffer, presented: Any) -> Admission:
        kind = "mac" if isinstance(presented, MacRequest) else "signed"
        kind += "+offer" if getattr(presented, "offer", None) else ""
        kind += "!link" if getattr(presented, "link", self.link) != self.link else ""
        self.presented.append((method.rsplit("/", 1)[-1], kind))
        return await super().admit(method, frame, presented)


async def test_calls_after_the_first_are_macd_and_a_lost_session_is_signed_again() -> None:
    fleet = fake_with_run()
    gate = _Recording(fleet)
    async with AsyncExitStack() as stack:
        listener = await stack.enter_async_context(serve_fleet(fleet, "127.0.0.1", 0, gate=gate))
        client = await stack.enter_async_context(GrpcFleetClient(listener.host, listener.port))
        node_id = await client.register_node({}, 1.0)
        fleet.send(RUN_ID, message_for(node_id))
        await client.pull_messages(node_id)
        await client.get_run(node_id, RUN_ID)
        assert gate.presented == [
            ("RegisterNode", "signed+offer!link"),  # the link's name comes with the refusal
            ("RegisterNode", "signed+offer"),
            ("PullMessages", "mac"),
            ("GetRun", "mac"),
        ]
        await collect(client.get_bundle(node_id, RUN_ID))  # streams are always signed
        await client.pull_messages(node_id)  # and leave the session as it was
        assert gate.presented[-2:] == [("GetBundle", "signed"), ("PullMessages", "mac")]
        # The link restarts on the same port, holding no session.
        await stack.aclose()
        restarted = _Recording(fleet)
        await stack.enter_async_context(
            serve_fleet(fleet, "127.0.0.1", listener.port, gate=restarted)
        )
        await stack.enter_async_context(client)
        await client.pull_messages(node_id)
        assert restarted.presented == [
            ("PullMessages", "mac"),  # a session the link no longer holds
            ("PullMessages", "signed+offer!link"),  # signed for the link before its restart
            ("PullMessages", "signed+offer"),
        ]
        await client.pull_messages(node_id)
        assert restarted.presented[-1] == ("PullMessages", "mac")


async def test_a_streamed_call_after_a_link_restart_is_refused_once_then_signed_anew() -> None:
    fleet = fake_with_run()
    async with AsyncExitStack() as stack:
        listener = await stack.enter_async_context(
            serve_fleet(fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock()))
        )
        client = await stack.enter_async_context(GrpcFleetClient(listener.host, listener.port))
        node_id = await client.register_node({}, 1.0)
        fleet.send(RUN_ID, message_for(node_id))
        await client.pull_messages(node_id)
        await stack.aclose()
        restarted = NodeGate(fleet, SystemClock())
        await stack.enter_async_context(
            serve_fleet(fleet, "127.0.0.1", listener.port, gate=restarted)
        )
        await stack.enter_async_context(client)
        # Signed for the link's name before the restart: refused as an outage, which a
        # node retries; the refusal told the new name, so the call goes through again.
        with pytest.raises(LinkUnavailableError, match="restarted since this node last signed"):
            await collect(client.get_bundle(node_id, RUN_ID))
        assert (await collect(client.get_bundle(node_id, RUN_ID)))[1] == b"bundle"


class _NoSessions(_Recording):
    """A link's gate that admits signed calls and never opens a session."""

    async def admit(self, method: str, frame: Buffer, presented: Any) -> Admission:
        admission = await super().admit(method, frame, presented)
        return Admission(admission.public_key)


async def test_against_a_link_that_opens_no_session_the_client_signs_and_stops_offering() -> None:
    fleet = fake_with_run()
    gate = _NoSessions(fleet)
    async with (
        serve_fleet(fleet, "127.0.0.1", 0, gate=gate) as listener,
        GrpcFleetClient(listener.host, listener.port) as client,
    ):
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        await client.heartbeat(node_id, 1.0)
    assert [kind for _, kind in gate.presented] == [
        "signed+offer!link",
        "signed+offer",
        "signed",
        "signed",
    ]


async def test_two_connections_of_one_node_keep_a_session_each() -> None:
    fleet = fake_with_run()
    gate = _Recording(fleet)
    async with serve_fleet(fleet, "127.0.0.1", 0, gate=gate) as listener:
        calls = GrpcFleetClient(listener.host, listener.port)
        beats = GrpcFleetClient(listener.host, listener.port, key=calls.key)
        async with calls, beats:
            node_id = await calls.register_node({}, 1.0)
            for _ in range(3):  # as a node's pulls and heartbeats alternate
                await calls.pull_messages(node_id)
                await beats.pull_messages(node_id)
    kinds = [kind for _, kind in gate.presented]
    assert kinds == [
        "signed+offer!link",
        "signed+offer",
        "mac",
        "signed+offer!link",  # each client learns the link's name for itself
        "signed+offer",
        "mac",
        "mac",
        "mac",
        "mac",
    ]
