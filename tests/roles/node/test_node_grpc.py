"""The node over the gRPC fleet client on loopback: it serves, and reconnects after a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import numpy as np
import pytest
from node_helpers import Runners, add_run, make_bundle, node, stored_weights, train

from fedcore.apps.client_app import ClientApp
from fedcore.auth.fleet_gate import NodeGate
from fedcore.domain import ArrayRecord, Context, Message, RecordDict
from fedcore.roles.node import BackoffPolicy
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet
from fedcore.transport.grpc import GrpcFleetClient, serve_fleet
from fedcore.wire.fleet import MAX_INLINE_CONTENT

pytestmark = pytest.mark.anyio

QUICK = BackoffPolicy(initial=0.1, maximum=1.0)


def doubling() -> ClientApp:
    client = ClientApp()

    @client.train()
    async def double(msg: Message, context: Context) -> Message:
        weights = msg.content["arrays"]["w"]
        return Message(RecordDict({"arrays": ArrayRecord({"w": weights * 2})}), reply_to=msg)

    return client


async def until(clock: FakeClock, predicate: Callable[[], bool]) -> None:
    """Let the network and the node work, moving the fake clock on, until ``predicate()``."""
    with anyio.fail_after(15):
        while not predicate():
            clock.advance(0.02)
            for _ in range(20):  # scheduling points: socket events are handled in between
                await anyio.lowlevel.checkpoint()


async def test_a_node_serves_over_grpc_and_comes_back_after_the_link_restarts(
    fake_clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    bundle = make_bundle(tmp_path, "app")
    weights = np.arange(MAX_INLINE_CONTENT // 4 + 10, dtype=np.float32)
    large = RecordDict({"arrays": ArrayRecord({"w": weights})})
    before, after = FakeFleet(fake_clock), FakeFleet(fake_clock)
    for fleet in (before, after):
        add_run(fleet, 1, bundle)
    runners = Runners({"app:client": doubling()})
    async with AsyncExitStack() as first_link:
        port = (
            await first_link.enter_async_context(
                serve_fleet(before, "127.0.0.1", 0, gate=NodeGate(before, fake_clock))
            )
        ).port
        async with (
            GrpcFleetClient("127.0.0.1", port, clock=fake_clock) as client,
            node(client, fake_clock, tmp_path / "cache", runners, backoff=QUICK) as serving,
        ):
            first_id = await serving.wait_registered()
            sent = before.send(1, train(first_id, large))
            await until(fake_clock, lambda: sent in before.replies)
            np.testing.assert_array_equal(stored_weights(before, sent), weights * 2)

            # The link goes away, and comes back on the same port without its memory.
            await first_link.aclose()
            await until(fake_clock, lambda: "unavailable" in caplog.text)
            async with serve_fleet(after, "127.0.0.1", port, gate=NodeGate(after, fake_clock)):
                await until(fake_clock, lambda: len(after.nodes) == 1)
                (second_id,) = after.nodes
                assert second_id == await serving.wait_registered()
                sent = after.send(1, train(second_id, large))
                await until(fake_clock, lambda: sent in after.replies)
                np.testing.assert_array_equal(stored_weights(after, sent), weights * 2)
                # Each outage is one line when it starts and one when it ends. (Calls
                # that outrun the fake clock's racing time count as outages too.)
                outages = [r.levelno for r in caplog.records if r.name.endswith(".retry")]
                assert outages == [logging.WARNING, logging.INFO] * (len(outages) // 2)
                # Which call meets the outage first (a cut-off pull, a refused heartbeat,
                # or one the racing fake clock timed out) is a race; either way it is
                # reported as the link being away.
                first = next(r.getMessage() for r in caplog.records if r.name.endswith(".retry"))
                assert "is unavailable: " in first or "did not answer" in first, first
                assert f"the link does not know node {first_id} any more" in caplog.text
