"""The fleet API's rates beyond the peer's: per node key, and for registrations.

A registered node flooding the link is limited by its key whatever its address; a
flood of registrations (each a new key, a row and a log line) is limited per address
and in all. Each refusal is RESOURCE_EXHAUSTED with the seconds to wait, which the
client reads into its LinkBusyError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from fedcore.auth.fleet_gate import NodeGate
from fedcore.clock import SystemClock
from fedcore.errors import LinkBusyError
from fedcore.testing.fleet import FakeFleet
from fedcore.transport.grpc import GrpcFleetClient, serve_fleet
from fedcore.transport.grpc.client import MAX_RETRY_HINT
from fedcore.transport.grpc.guard import FleetLimits, Rates

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def served(limits: FleetLimits) -> AsyncIterator[tuple[str, int]]:
    fleet = FakeFleet(SystemClock())
    async with serve_fleet(
        fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock()), limits=limits
    ) as listener:
        yield listener.host, listener.port


async def test_a_key_over_its_rate_is_refused_with_a_hint_and_another_key_is_served() -> None:
    limits = FleetLimits(requests_per_second_per_key=0.5, request_burst_per_key=3)
    async with (
        served(limits) as (host, port),
        GrpcFleetClient(host, port) as flooding,
        GrpcFleetClient(host, port) as other,
    ):
        node_id = await flooding.register_node({}, 1.0)  # 1
        await flooding.heartbeat(node_id, 1.0)  # 2
        await flooding.heartbeat(node_id, 1.0)  # 3
        with pytest.raises(LinkBusyError, match="over its request rate") as refused:
            await flooding.heartbeat(node_id, 1.0)
        assert 0.0 < refused.value.retry_after <= 2.0  # one token at 0.5 a second
        other_id = await other.register_node({}, 1.0)  # the same address, another key
        await other.heartbeat(other_id, 1.0)


async def test_registrations_from_one_address_are_limited_and_its_other_calls_are_not() -> None:
    limits = FleetLimits(registrations_per_second=0.01, registration_burst=2)
    async with served(limits) as (host, port):
        clients = [GrpcFleetClient(host, port) for _ in range(3)]
        async with clients[0], clients[1], clients[2]:
            first = await clients[0].register_node({}, 1.0)
            await clients[1].register_node({}, 1.0)
            with pytest.raises(
                LinkBusyError, match=r"127\.0\.0\.1 is over its registration rate"
            ) as refused:
                await clients[2].register_node({}, 1.0)
            assert refused.value.retry_after == MAX_RETRY_HINT  # 100 s asked, at most 60 taken
            for _ in range(5):
                await clients[0].heartbeat(first, 1.0)


async def test_registrations_in_all_are_limited_beyond_each_address() -> None:
    limits = FleetLimits(
        registration_burst=100, registrations_per_second_total=1.0, registration_burst_total=2
    )
    async with served(limits) as (host, port):
        clients = [GrpcFleetClient(host, port) for _ in range(3)]
        async with clients[0], clients[1], clients[2]:
            await clients[0].register_node({}, 1.0)
            await clients[1].register_node({}, 1.0)
            with pytest.raises(
                LinkBusyError, match="the link is over its registration rate"
            ) as refused:
                await clients[2].register_node({}, 1.0)
            assert 0.0 < refused.value.retry_after <= 1.0


def test_a_bucket_says_how_long_until_its_next_token_and_takes_one_given_back() -> None:
    now = [0.0]
    rates = Rates(rate=2.0, burst=2, now=lambda: now[0])
    assert rates.admit("a") == rates.admit("a") == 0.0
    assert rates.admit("a") == pytest.approx(0.5)
    now[0] = 0.25
    assert rates.admit("a") == pytest.approx(0.25)
    assert rates.admit("b") == 0.0  # a bucket of its own
    rates.give_back("a")
    assert rates.admit("a") == 0.0
    assert rates.admit("a") > 0.0
