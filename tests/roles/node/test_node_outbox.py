"""Replies: stored once, retried while the link is away, dropped when refused; leases renewed."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from node_helpers import FlakyFleet, Runners, add_run, advance, make_bundle, node, train, until

from fedcore.apps.client_app import ClientApp
from fedcore.domain import ConfigRecord, Context, Message, MetricRecord, RecordDict
from fedcore.errors import (
    ConflictError,
    FedcoreError,
    MessageNotFoundError,
    ReplyRejectedError,
    RunFinishedError,
)
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet

pytestmark = pytest.mark.anyio


class Echo:
    """A ClientApp answering ``x`` with ``x + 1``; a gate, when closed, holds each message."""

    def __init__(self) -> None:
        self.client = ClientApp()
        self.started: list[str] = []
        self.gate = anyio.Event()
        self.gate.set()

        @self.client.train()
        async def handle(msg: Message, context: Context) -> Message:
            self.started.append(msg.metadata.message_id)
            await self.gate.wait()
            x = msg.content["in"]["x"]
            return Message(RecordDict({"out": MetricRecord({"y": x + 1})}), reply_to=msg)


@pytest.fixture
def echo() -> Echo:
    return Echo()


@pytest.fixture
def runners(echo: Echo) -> Runners:
    return Runners({"app:client": echo.client})


def ask(node_id: int, x: int, *, ttl: float | None = None) -> Message:
    return train(node_id, RecordDict({"in": ConfigRecord({"x": x})}), ttl=ttl)


async def test_a_reply_is_pushed_and_stored_once(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path, runners: Runners
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, ask(node_id, 41))
        await until(lambda: message_id in fake.replies)
    stored = fake.replies[message_id].reply
    assert stored.content["out"]["y"] == 42
    assert stored.metadata.src_node_id == node_id
    assert fleet.calls["push_reply"] == 1


async def test_a_push_while_the_link_is_away_is_retried_with_backoff_and_stored_once(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    runners: Runners,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    fleet.down["push_reply"] = 3
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, ask(node_id, 1))
        await until(lambda: fleet.calls["push_reply"] == 1)
        assert message_id not in fake.replies
        await advance(fake_clock, 10.0, step=0.1)
        await until(lambda: message_id in fake.replies)
        start = fake_clock.now()
        await advance(fake_clock, 2.0)
        # While the reply waited, heartbeats renewed the message's lease.
        assert any(message_id in ids for _, ids, _ in fleet.heartbeats)
        assert all(message_id not in ids for time, ids, _ in fleet.heartbeats if time > start)
    assert fleet.calls["push_reply"] == 4
    assert all(reply is fleet.pushed[0] for reply in fleet.pushed)  # the same reply, not rebuilt
    assert len(fake.replies) == 1
    assert fake.replies[message_id].reply.content["out"]["y"] == 2
    assert caplog.text.count("retrying with backoff") == 1


async def test_a_retry_after_a_lost_answer_is_an_identical_duplicate(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    runners: Runners,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="fedcore.roles.node")
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    fleet.lose["push_reply"] = 1  # the link stores the reply, and its answer is lost
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, ask(node_id, 1))
        await until(lambda: message_id in fake.replies)
        first = fake.replies[message_id].reply.metadata.message_id
        await advance(fake_clock, 5.0, step=0.1)
        await until(lambda: fleet.calls["push_reply"] == 2)
    assert fake.replies[message_id].reply.metadata.message_id == first
    assert fleet.pushed[0] is fleet.pushed[1]
    assert "reply stored (again: a retry)" in caplog.text


@pytest.mark.parametrize(
    "refusal",
    [
        ConflictError("message has a different reply"),
        ReplyRejectedError("message expired"),
        MessageNotFoundError("no such message"),
        RunFinishedError("run 1 has finished"),
    ],
    ids=type,
)
async def test_a_final_refusal_drops_the_reply_and_the_node_carries_on(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    runners: Runners,
    caplog: pytest.LogCaptureFixture,
    refusal: FedcoreError,
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    fleet.refuse["push_reply"] = refusal
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        dropped = fake.send(1, ask(node_id, 1))
        await until(lambda: fleet.calls["push_reply"] == 1)
        await advance(fake_clock, 10.0)
        assert fleet.calls["push_reply"] == 1  # not retried
        assert dropped not in fake.replies
        assert str(refusal) in caplog.text
        assert dropped in caplog.text
        served = fake.send(1, ask(node_id, 2))
        await until(lambda: served in fake.replies)
    assert fake.replies[served].reply.content["out"]["y"] == 3
    if isinstance(refusal, RunFinishedError):  # the run is forgotten: the next message loads it
        assert [run_id for run_id, _, _ in runners.started] == [1, 1]
    else:
        assert len(runners.started) == 1


async def test_leases_are_renewed_while_a_slow_client_app_works(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    echo: Echo,
    runners: Runners,
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    echo.gate = anyio.Event()
    # Room for a second message, and short pulls: a message whose lease ran out would
    # be pulled again within a second.
    options = {"max_concurrent": 2, "wait_seconds": 1.0}
    async with node(fleet, fake_clock, tmp_path / "cache", runners, **options) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, ask(node_id, 1))
        await until(lambda: len(echo.started) == 1)
        await advance(fake_clock, 20.0)  # the lease is 3 s
        assert echo.started == [message_id]
        renewals = [time for time, ids, lease in fleet.heartbeats if ids == (message_id,)]
        assert len(renewals) >= 19
        assert all(lease == 3.0 for _, ids, lease in fleet.heartbeats if ids)
        echo.gate.set()
        await until(lambda: message_id in fake.replies)
    assert echo.started == [message_id]
    assert fleet.calls["push_reply"] == 1


async def test_a_message_whose_lease_the_link_released_is_abandoned(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    echo: Echo,
    runners: Runners,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    echo.gate = anyio.Event()
    runners.clock = FakeClock()  # one that stands still: the ClientApp's TTL never ends it
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        expiring = fake.send(1, ask(node_id, 1, ttl=2.5))
        await until(lambda: len(echo.started) == 1)
        await advance(fake_clock, 3.0)  # expired: the next heartbeat reports it released
        assert f"message {expiring}: the link released its lease" in caplog.text
        echo.gate.set()
        # Its slot is free again (max_concurrent=1): the next message is served.
        served = fake.send(1, ask(node_id, 5))
        await until(lambda: served in fake.replies)
    assert [reply.metadata.reply_to_message_id for reply in fleet.pushed] == [served]


async def test_a_message_delivered_again_while_in_flight_runs_once(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    echo: Echo,
    runners: Runners,
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    echo.gate = anyio.Event()
    fleet.offline = False
    options = {"max_concurrent": 2, "wait_seconds": 1.0}
    async with node(fleet, fake_clock, tmp_path / "cache", runners, **options) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, ask(node_id, 1))
        await until(lambda: len(echo.started) == 1)
        fleet.down["heartbeat"] = 4  # the lease (3 s) runs out; the link leases it out again
        await advance(fake_clock, 6.0)
        assert fleet.calls["pull_messages"] >= 5
        echo.gate.set()
        await until(lambda: message_id in fake.replies)
    assert echo.started == [message_id]
    assert fleet.calls["push_reply"] == 1
