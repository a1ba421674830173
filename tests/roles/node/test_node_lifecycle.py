"""The node's lifecycle: register, heartbeat on cadence, register again when forgotten, stop."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from node_helpers import (
    NODE_CONFIG,
    FlakyFleet,
    Runners,
    add_run,
    advance,
    make_bundle,
    node,
    settle,
    train,
    until,
)

from fedcore.apps.client_app import ClientApp
from fedcore.domain import Context, Message, MetricRecord, RecordDict
from fedcore.errors import DecodeError
from fedcore.roles.node import Node
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet

pytestmark = pytest.mark.anyio


def gated() -> tuple[ClientApp, anyio.Event, list[str]]:
    """A ClientApp whose handler waits for the returned event; it lists what it started."""
    client, gate, started = ClientApp(), anyio.Event(), []

    @client.train()
    async def handle(msg: Message, context: Context) -> Message:
        started.append(msg.metadata.message_id)
        await gate.wait()
        return Message(RecordDict({"m": MetricRecord({"ok": 1})}), reply_to=msg)

    return client, gate, started


async def test_it_registers_with_its_config_and_heartbeats_on_cadence(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    start = fake_clock.now()
    async with node(fleet, fake_clock, tmp_path, Runners({})) as serving:
        node_id = await serving.wait_registered()
        assert fake.nodes[node_id].node_config == NODE_CONFIG
        assert fake.nodes[node_id].heartbeat_interval == 1.0
        await advance(fake_clock, 0.75)
        assert fleet.heartbeats == []
        await advance(fake_clock, 3.25)
        assert [time - start for time, _, _ in fleet.heartbeats] == [1.0, 2.0, 3.0, 4.0]
        assert all(ids == () and lease is None for _, ids, lease in fleet.heartbeats)
        assert fake.nodes[node_id].last_heartbeat == start + 4.0


async def test_heartbeats_go_through_their_own_fleet_connection_when_given(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    beats = FlakyFleet(fake)  # the same link, another connection
    async with node(fleet, fake_clock, tmp_path, Runners({}), heartbeat_fleet=beats) as serving:
        await serving.wait_registered()
        await advance(fake_clock, 3.0)
    assert len(beats.heartbeats) == 3
    assert fleet.heartbeats == []
    assert fleet.calls["register_node"] == 1
    assert beats.calls["register_node"] == 0


async def test_a_clean_exit_unregisters(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    async with node(fleet, fake_clock, tmp_path, Runners({})) as serving:
        node_id = await serving.wait_registered()
        assert node_id in fake.nodes
    assert fake.nodes == {}
    assert fleet.calls["unregister_node"] == 1


async def test_a_cancelled_body_still_unregisters(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    with anyio.CancelScope() as scope:
        async with node(fleet, fake_clock, tmp_path, Runners({})) as serving:
            await serving.wait_registered()
            scope.cancel()
            await anyio.sleep_forever()
    assert fake.nodes == {}


async def test_registering_retries_while_the_link_is_away_and_logs_the_outage_once(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    fleet.down["register_node"] = 5
    async with node(fleet, fake_clock, tmp_path, Runners({})) as serving:
        await advance(fake_clock, 60.0, step=0.5)
        node_id = await serving.wait_registered()
    assert fleet.calls["register_node"] == 6
    messages = [record.getMessage() for record in caplog.records]
    assert sum("unavailable" in message for message in messages) == 1
    assert sum("the link is back" in message for message in messages) == 1
    assert f"registered with the link as node {node_id}" in messages


async def test_a_link_that_refuses_the_node_ends_it_with_that_error(
    fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    fleet.refuse["register_node"] = DecodeError("node_config has a nested table")
    with pytest.raises(DecodeError, match="nested table"):
        async with node(fleet, fake_clock, tmp_path, Runners({})):
            await anyio.sleep_forever()


async def test_a_forgotten_node_registers_again_and_drops_the_old_ids_work(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    client, gate, started = gated()
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    async with node(fleet, fake_clock, tmp_path / "cache", Runners({"app:client": client})) as n:
        old_id = await n.wait_registered()
        fake.send(1, train(old_id))
        await until(lambda: len(started) == 1)
        del fake.nodes[old_id]  # the link forgot it: deleted, or restarted on :memory:
        await advance(fake_clock, 1.0)
        await until(lambda: len(fake.nodes) == 1)
        new_id = await n.wait_registered()
        assert new_id != old_id
        assert set(fake.nodes) == {new_id}
        gate.set()
        await settle()
        # The old id's message was abandoned: its reply is never pushed.
        assert fleet.calls["push_reply"] == 0
        # The new id heartbeats and serves messages.
        await advance(fake_clock, 1.0)
        assert fleet.heartbeats[-1][0] == fake_clock.now()
        message_id = fake.send(1, train(new_id))
        await until(lambda: message_id in fake.replies)


async def test_stopping_lets_work_in_flight_finish_within_the_drain_timeout(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    client, gate, started = gated()
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": client})

    async def finish_soon() -> None:
        await until(lambda: fleet.calls["unregister_node"] == 0 and len(started) == 1)
        await advance(fake_clock, 1.0)  # well within the drain timeout (2 s)
        gate.set()

    async with (
        anyio.create_task_group() as tg,
        node(fleet, fake_clock, tmp_path / "cache", runners) as serving,
    ):
        node_id = await serving.wait_registered()
        message_id = fake.send(1, train(node_id))
        await until(lambda: len(started) == 1)
        tg.start_soon(finish_soon)
    assert fake.replies[message_id].reply.content["m"]["ok"] == 1
    assert fleet.calls["push_reply"] == 1
    assert fake.nodes == {}
    assert runners.open == 0


async def test_stopping_abandons_work_past_the_drain_timeout(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, _, started = gated()  # never released
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": client})

    async def run_the_clock() -> None:
        await advance(fake_clock, 2.5)

    async with (
        anyio.create_task_group() as tg,
        node(fleet, fake_clock, tmp_path / "cache", runners) as serving,
    ):
        node_id = await serving.wait_registered()
        fake.send(1, train(node_id))
        await until(lambda: len(started) == 1)
        tg.start_soon(run_the_clock)
    assert fake.replies != {}  # the link answered it (code 5) when the node unregistered
    assert all(stored.reply.has_error() for stored in fake.replies.values())
    assert fleet.calls["push_reply"] == 0
    assert fake.nodes == {}
    assert runners.open == 0
    assert "stopping with 1 messages unfinished" in caplog.text


async def test_an_unreachable_link_at_exit_does_not_hold_the_node(
    fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with node(fleet, fake_clock, tmp_path, Runners({})) as serving:
        await serving.wait_registered()
        fleet.offline = True
    assert "could not unregister" in caplog.text


async def test_pulls_back_off_while_the_link_is_away(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    client, gate, _ = gated()
    gate.set()
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    async with node(fleet, fake_clock, tmp_path / "cache", Runners({"app:client": client})) as n:
        node_id = await n.wait_registered()
        await settle()
        pulls_before = fleet.calls["pull_messages"]
        fleet.offline = True
        await advance(fake_clock, 150.0, step=0.5)  # the waiting pull ends at 30 s, then fails
        failed_pulls = fleet.calls["pull_messages"] - pulls_before
        # Backoff (0.5 s doubling to 30 s, full jitter) over 2 minutes: a handful of
        # attempts (15 with this seed), not one per step of the clock (240).
        assert 3 <= failed_pulls <= 25
        message_id = fake.send(1, train(node_id))
        fleet.offline = False
        await advance(fake_clock, 60.0, step=0.5)
        await until(lambda: message_id in fake.replies)
        assert fake.nodes[node_id].last_heartbeat == fake_clock.now()


async def test_a_rate_limited_link_is_waited_out_with_backoff_and_logged_once(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RESOURCE_EXHAUSTED (LinkBusyError) on every call is an episode, not an exit."""
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    client, gate, _ = gated()
    gate.set()
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    async with node(fleet, fake_clock, tmp_path / "cache", Runners({"app:client": client})) as n:
        node_id = await n.wait_registered()
        await settle()
        pulls_before = fleet.calls["pull_messages"]
        beats_before = fleet.calls["heartbeat"]
        fleet.rate_limited = True
        await advance(fake_clock, 150.0, step=0.5)
        refused_pulls = fleet.calls["pull_messages"] - pulls_before
        assert 3 <= refused_pulls <= 25  # backoff, not one per step of the clock (300)
        assert fleet.calls["heartbeat"] - beats_before >= 140  # still beating on cadence
        message_id = fake.send(1, train(node_id))
        fleet.rate_limited = False
        await advance(fake_clock, 60.0, step=0.5)
        await until(lambda: message_id in fake.replies)
        assert fake.nodes[node_id].last_heartbeat == fake_clock.now()
    # Two episodes, each logged once: the pull already waiting on the link when the
    # refusals began was answered at 30 s (the link is back), then its successor refused.
    refused = fleet.calls["heartbeat"] - beats_before + refused_pulls
    messages = [record.getMessage() for record in caplog.records]
    assert sum("RESOURCE_EXHAUSTED" in message for message in messages) == 2 < refused
    assert sum("the link is back" in message for message in messages) == 2


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"heartbeat_interval": 0.0}, "heartbeat_interval"),
        ({"lease": 1.0}, "longer than heartbeat_interval"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"wait_seconds": 0.0}, "wait_seconds"),
        ({"drain_timeout": float("inf")}, "drain_timeout"),
    ],
)
def test_settings_out_of_range_are_refused(
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    options: dict[str, float],
    problem: str,
) -> None:
    with pytest.raises(ValueError, match=problem):
        node(fleet, fake_clock, tmp_path, Runners({}), **options)


async def test_a_node_runs_once(fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path) -> None:
    serving: Node = node(fleet, fake_clock, tmp_path, Runners({}))
    async with serving:
        await serving.wait_registered()
    with pytest.raises(RuntimeError, match="runs once"):
        await serving.__aenter__()
