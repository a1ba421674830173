"""Contents over the inline limit travel as payloads both ways; a lost payload is pushed again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from node_helpers import (
    FlakyFleet,
    Runners,
    add_run,
    advance,
    make_bundle,
    node,
    stored_weights,
    train,
    until,
)

from fedcore.apps.client_app import ClientApp
from fedcore.domain import ArrayRecord, Context, Message, RecordDict
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet
from fedcore.wire.fleet import MAX_INLINE_CONTENT

pytestmark = pytest.mark.anyio

LARGE = MAX_INLINE_CONTENT // 4 + 1024
"""float32s in an array just over the inline limit."""


def doubling(seen: list[np.ndarray]) -> ClientApp:
    client = ClientApp()

    @client.train()
    async def double(msg: Message, context: Context) -> Message:
        weights = msg.content["arrays"]["w"]
        seen.append(weights)
        return Message(RecordDict({"arrays": ArrayRecord({"w": weights * 2})}), reply_to=msg)

    return client


def large_message(node_id: int) -> tuple[Message, np.ndarray]:
    weights = np.arange(LARGE, dtype=np.float32)
    return train(node_id, RecordDict({"arrays": ArrayRecord({"w": weights})})), weights


async def test_large_contents_travel_as_payloads_both_ways(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    seen: list[np.ndarray] = []
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": doubling(seen)})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message, weights = large_message(node_id)
        message_id = fake.send(1, message)
        await until(lambda: message_id in fake.replies)
    assert fleet.calls["pull_payload"] == 1
    assert fleet.calls["push_payload"] == 1
    np.testing.assert_array_equal(seen[0], weights)
    assert not seen[0].flags.writeable  # a view of the fetched buffer, not a copy
    np.testing.assert_array_equal(stored_weights(fake, message_id), weights * 2)


async def test_a_payload_the_link_lost_is_pushed_again_with_the_same_reply(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": doubling([])})
    fleet.forget_payload_once = True
    fleet.down["push_payload"] = 1
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message, weights = large_message(node_id)
        message_id = fake.send(1, message)
        await until(lambda: fleet.calls["push_payload"] == 1)
        await advance(fake_clock, 5.0, step=0.1)
        await until(lambda: message_id in fake.replies)
    # Pushed, refused (link away), pushed; the reply named it, and it was gone: once more.
    assert fleet.calls["push_payload"] == 3
    assert fleet.calls["push_reply"] == 2
    assert fleet.pushed[0] is fleet.pushed[1]
    np.testing.assert_array_equal(stored_weights(fake, message_id), weights * 2)


async def test_a_payload_shorter_than_announced_drops_the_message(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[np.ndarray] = []
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": doubling(seen)})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message, _ = large_message(node_id)
        message_id = fake.send(1, message)
        (payload,) = fake.payloads.values()
        payload.parts = [b"truncated"]
        await until(lambda: message_id in caplog.text)
    assert "ended after 9 of" in caplog.text
    assert seen == []
    assert fleet.calls["push_reply"] == 0
