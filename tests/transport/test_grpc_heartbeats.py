"""Heartbeats on one long call, on loopback: a frame per beat, each MAC'd, refused when forged.

A node in a session sends its heartbeats on a ``Heartbeats`` call; the link checks
every frame's MAC (its place in the call), its node, the session and the peer's rate,
and a beat the call cannot carry goes as a Heartbeat call of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from fedcore.auth.fleet_gate import Admission, NodeGate
from fedcore.auth.keys import NodeKey
from fedcore.auth.sessions import ClientSession, MacRequest
from fedcore.auth.signatures import sign
from fedcore.auth.stamps import new_stamp
from fedcore.clock import SystemClock
from fedcore.errors import AuthenticationError, LinkBusyError
from fedcore.testing.fleet import FakeFleet
from fedcore.transport.fleet import Buffer
from fedcore.transport.grpc import GrpcFleetClient, serve_fleet
from fedcore.transport.grpc import server as grpc_server
from fedcore.transport.grpc.frames import RawCodec
from fedcore.transport.grpc.guard import FleetLimits
from fedcore.transport.grpc.heartbeats import raise_ended
from fedcore.wire import rpc as wire
from fedcore.wire.rpc import FleetMethod

pytestmark = pytest.mark.anyio


LEARNED = ["RegisterNode signed!link", "RegisterNode signed"]
"""A client's first call, refused with the link's name, and again signed for it."""


class _Recording(NodeGate):
    """The link's gate, noting each call it was asked to admit (``!link``: signed for a name
    other than the gate's, so refused: a client's first call learns the name so)."""

    def __init__(self, fleet: FakeFleet, **kwargs: Any) -> None:
        super().__init__(fleet, SystemClock(), **kwargs)
        self.calls: list[str] = []

    async def admit(self, method: str, frame: Buffer, presented: Any) -> Admission:
        kind = "mac" if isinstance(presented, MacRequest) else "signed"
        kind += "!link" if getattr(presented, "link", self.link) != self.link else ""
        self.calls.append(f"{method.rsplit('/', 1)[-1]} {kind}")
        return await super().admit(method, frame, presented)


class _CountingFleet(FakeFleet):
    """A fake link that counts heartbeats, and can hold one until told to answer."""

    def __init__(self) -> None:
        super().__init__(SystemClock())
        self.beats = 0
        self.hold: anyio.Event | None = None
        self.held = anyio.Event()
        """Set once a heartbeat is held."""

    async def heartbeat(
        self,
        node_id: int,
        heartbeat_interval: float,
        working_message_ids: Sequence[str] = (),
        lease_seconds: float | None = None,
    ) -> list[str]:
        self.beats += 1
        if self.hold is not None:
            self.held.set()
            await self.hold.wait()
        return await super().heartbeat(
            node_id, heartbeat_interval, working_message_ids, lease_seconds
        )


@asynccontextmanager
async def link(
    fleet: FakeFleet, gate: NodeGate, limits: FleetLimits | None = None
) -> AsyncIterator[GrpcFleetClient]:
    options = {} if limits is None else {"limits": limits}
    async with (
        serve_fleet(fleet, "127.0.0.1", 0, gate=gate, **options) as listener,
        GrpcFleetClient(listener.host, listener.port) as client,
    ):
        yield client


async def test_beats_after_the_first_go_on_one_call() -> None:
    fleet = _CountingFleet()
    gate = _Recording(fleet)
    async with link(fleet, gate) as client:
        node_id = await client.register_node({}, 1.0)
        for interval in (1.0, 2.0, 3.0, 4.0, 5.0):
            assert await client.heartbeat(node_id, interval) == []
            assert fleet.nodes[node_id].heartbeat_interval == interval
    assert fleet.beats == 5
    assert gate.calls == [*LEARNED, "Heartbeats mac"]


async def test_beats_carry_leases_and_their_released_ids_back() -> None:
    fleet = _CountingFleet()
    async with link(fleet, NodeGate(fleet, SystemClock())) as client:
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        released = await client.heartbeat(node_id, 1.0, ["gone-1", "gone-2"], 3.0)
    assert released == ["gone-1", "gone-2"]  # leased by no one: the link lets them go


async def test_a_beat_cancelled_on_the_call_leaves_the_next_on_a_new_call() -> None:
    fleet = _CountingFleet()
    gate = _Recording(fleet)
    async with link(fleet, gate) as client:
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        fleet.hold = anyio.Event()
        with anyio.move_on_after(0.3) as late:
            await client.heartbeat(node_id, 1.0)
        assert late.cancelled_caught
        fleet.hold.set()
        fleet.hold = None
        await client.heartbeat(node_id, 1.0)
        await client.heartbeat(node_id, 1.0)
    assert gate.calls == [*LEARNED, "Heartbeats mac", "Heartbeats mac"]


async def test_a_beat_while_another_is_on_the_call_goes_as_a_call_of_its_own() -> None:
    fleet = _CountingFleet()
    gate = _Recording(fleet)
    async with link(fleet, gate) as client:
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        fleet.hold = anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.heartbeat, node_id, 1.0)
            with anyio.fail_after(5):
                await fleet.held.wait()  # the first is held on the call
            fleet.hold.set()
            await client.heartbeat(node_id, 2.0)
    assert gate.calls[-1] == "Heartbeat mac"
    assert fleet.beats == 3


async def test_a_key_taken_off_the_authorized_list_is_refused_on_the_call() -> None:
    fleet, key = _CountingFleet(), NodeKey.generate()
    gate = NodeGate(fleet, SystemClock(), authorized=[key.public])
    async with (
        serve_fleet(fleet, "127.0.0.1", 0, gate=gate) as listener,
        GrpcFleetClient(listener.host, listener.port, key=key) as client,
    ):
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        await client.heartbeat(node_id, 1.0)
        gate.authorize([])
        with pytest.raises(AuthenticationError, match="not among"):
            await client.heartbeat(node_id, 1.0)
    assert fleet.beats == 2


class _Logged(logging.Handler):
    """Sets ``seen`` once a log record has ``text`` in its message."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_a_call_idle_past_the_idle_timeout_is_ended_and_the_next_beat_gets_through() -> None:
    fleet = _CountingFleet()
    gate = _Recording(fleet)
    ended = _Logged("did not arrive within 0.2 s")  # the link's only sign that it ended the call
    logging.getLogger("fedcore").addHandler(ended)
    async with link(fleet, gate, FleetLimits(idle_timeout=0.2)) as client:
        node_id = await client.register_node({}, 1.0)
        await client.heartbeat(node_id, 1.0)
        try:
            with anyio.fail_after(10):
                await ended.seen.wait()
        finally:
            logging.getLogger("fedcore").removeHandler(ended)
        await client.heartbeat(node_id, 1.0)
        await client.heartbeat(node_id, 1.0)
    assert fleet.beats == 3
    assert gate.calls == [
        *LEARNED,
        "Heartbeats mac",
        "Heartbeat mac",  # the beat the ended call could not carry
        "Heartbeats mac",
    ]


async def test_every_frame_counts_against_the_peers_request_rate() -> None:
    fleet = _CountingFleet()
    limits = FleetLimits(requests_per_second=0.001, request_burst=5)
    async with link(fleet, NodeGate(fleet, SystemClock()), limits) as client:
        node_id = await client.register_node({}, 1.0)  # 1, 2: told the link's name, again
        await client.heartbeat(node_id, 1.0)  # 3: the call
        await client.heartbeat(node_id, 1.0)  # 4, 5: its next frames
        await client.heartbeat(node_id, 1.0)
        # Refused on the call, and then as a call of its own.
        with pytest.raises(LinkBusyError, match="RESOURCE_EXHAUSTED"):
            await client.heartbeat(node_id, 1.0)
    assert fleet.beats == 3


async def test_against_a_link_without_the_call_beats_go_as_calls_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older = grpc_server._FleetHandlers.__mapping__

    def without_heartbeats(self: Any) -> dict[str, Any]:
        mapping = older(self)
        del mapping[FleetMethod.HEARTBEATS.value]
        return mapping

    monkeypatch.setattr(grpc_server._FleetHandlers, "__mapping__", without_heartbeats)
    fleet = _CountingFleet()
    gate = _Recording(fleet)
    async with link(fleet, gate) as client:
        node_id = await client.register_node({}, 1.0)
        for _ in range(3):
            await client.heartbeat(node_id, 1.0)
    assert fleet.beats == 3
    assert gate.calls == LEARNED + ["Heartbeat mac"] * 3  # asked once


# ------------------------------------------------------------------- hostile frames


class _RawBeats:
    """A Heartbeats call made by hand in a real session: frames exactly as given."""

    def __init__(self, channel: Channel, session: ClientSession, first: bytes) -> None:
        self.session = session
        self.stamp = new_stamp(time.time())
        self.seal = session.seal(self.stamp[1])
        framed = wire.encode_heartbeat_frame(first, self.seal.mac(0, first))
        metadata = session.metadata(FleetMethod.HEARTBEATS.value, framed, time.time(), self.stamp)
        self.first = framed
        self.stream = channel.request(
            FleetMethod.HEARTBEATS.value,
            Cardinality.STREAM_STREAM,
            bytes,
            bytes,
            metadata=metadata,
        )

    async def refusal(self, frames: list[bytes]) -> GRPCError:
        """Send the first frame and then ``frames``; the status the link ended the call with."""
        try:
            async with self.stream:
                for frame in [self.first, *frames]:
                    await self.stream.send_message(frame)
                    if await self.stream.recv_message() is None:
                        raise_ended(self.stream)
        except GRPCError as exc:
            return exc
        raise AssertionError("the link answered every frame")


@asynccontextmanager
async def raw_session() -> AsyncIterator[tuple[Channel, ClientSession, int, int]]:
    """A channel to a link, a session a real client opened there, its node, another node."""
    fleet = _CountingFleet()
    async with (
        serve_fleet(
            fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock(), link=LINK)
        ) as listener,
        GrpcFleetClient(listener.host, listener.port) as client,
        GrpcFleetClient(listener.host, listener.port) as other,
        Channel(listener.host, listener.port, codec=RawCodec()) as channel,
    ):
        node_id = await client.register_node({}, 1.0)
        other_id = await other.register_node({}, 1.0)
        session = client._session
        assert session is not None
        yield channel, session, node_id, other_id


LINK = "the-link"
"""The name of the link :func:`raw_session` serves."""


def beat(node_id: int) -> bytes:
    return wire.encode_heartbeat_request(node_id, 1.0)


async def test_a_replayed_reordered_or_forged_frame_ends_the_call_unauthenticated() -> None:
    async with raw_session() as (channel, session, node_id, _):
        call = _RawBeats(channel, session, beat(node_id))
        error = await call.refusal([call.first])  # frame 0 again, as frame 1
        assert error.status is Status.UNAUTHENTICATED
        assert "MAC of the call's frame 1 is wrong" in (error.message or "")

        call = _RawBeats(channel, session, beat(node_id))
        skipped = wire.encode_heartbeat_frame(beat(node_id), call.seal.mac(2, beat(node_id)))
        assert (await call.refusal([skipped])).status is Status.UNAUTHENTICATED

        call = _RawBeats(channel, session, beat(node_id))
        other_call = _RawBeats(channel, session, beat(node_id))
        moved = wire.encode_heartbeat_frame(beat(node_id), other_call.seal.mac(1, beat(node_id)))
        assert (await call.refusal([moved])).status is Status.UNAUTHENTICATED

        call = _RawBeats(channel, session, beat(node_id))
        changed = wire.encode_heartbeat_frame(beat(node_id + 1), call.seal.mac(1, beat(node_id)))
        assert (await call.refusal([changed])).status is Status.UNAUTHENTICATED


async def test_a_frame_about_another_node_ends_the_call_unauthenticated() -> None:
    async with raw_session() as (channel, session, node_id, other_id):
        call = _RawBeats(channel, session, beat(node_id))
        theirs = wire.encode_heartbeat_frame(beat(other_id), call.seal.mac(1, beat(other_id)))
        error = await call.refusal([theirs])
        assert error.status is Status.UNAUTHENTICATED
        assert f"not node {other_id}'s" in (error.message or "")


async def test_a_signed_call_or_garbage_on_it_is_refused() -> None:
    async with raw_session() as (channel, session, node_id, _):
        call = _RawBeats(channel, session, beat(node_id))
        garbage = await call.refusal([b"\x0a\x05abc"])
        assert garbage.status is Status.INVALID_ARGUMENT
        signed = await _signed_beats(channel, beat(node_id))
        assert signed.status is Status.UNAUTHENTICATED
        assert "made in a session" in (signed.message or "")


async def _signed_beats(channel: Channel, request: bytes) -> GRPCError:
    frame = wire.encode_heartbeat_frame(request, bytes(32))
    metadata = sign(NodeKey.generate(), FleetMethod.HEARTBEATS.value, frame, time.time(), link=LINK)
    stream = channel.request(
        FleetMethod.HEARTBEATS.value, Cardinality.STREAM_STREAM, bytes, bytes, metadata=metadata
    )
    try:
        async with stream:
            await stream.send_message(frame, end=True)
            await stream.recv_message()
    except GRPCError as exc:
        return exc
    raise AssertionError("the link answered a signed Heartbeats call")
