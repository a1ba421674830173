"""Pulled payloads land in the node's payload store: every check holds, failures leave nothing.

The same checks run against both stores: the in-memory default, and the shared-memory
segments the deployment's node uses (the ClientApp's process maps them in turn).
"""

from __future__ import annotations

import errno
import gc
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from node_helpers import Runners, add_run, make_bundle, node, train, until

from fedcore.apps.client_app import ClientApp
from fedcore.domain import ArrayRecord, ConfigRecord, Context, ErrorCode, Message, RecordDict
from fedcore.domain.fleet import Digest, LeasedMessage, PayloadRef
from fedcore.errors import DecodeError, ResourceError
from fedcore.roles.node.payloads import MemoryPayloads, PayloadStore, with_payload
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet
from fedcore.wire import DEFAULT_LIMITS
from fedcore.wire.fleet import MAX_INLINE_CONTENT
from fedcore.workers import shared_memory
from fedcore.workers.shared_memory import SegmentSpace

pytestmark = pytest.mark.anyio

FLOATS = MAX_INLINE_CONTENT // 2
"""float32s: twice the inline limit, so the content travels as a payload."""


@pytest.fixture
def fake(fake_clock: FakeClock) -> FakeFleet:
    return FakeFleet(fake_clock, chunk_size=40_000)


@pytest.fixture
def space(tmp_path: Path) -> Iterator[SegmentSpace]:
    space = SegmentSpace(root=tmp_path / "shm")
    space.root.mkdir()
    yield space
    space.remove_all()


@pytest.fixture(params=["memory", "segments"])
def store(request: pytest.FixtureRequest, space: SegmentSpace) -> PayloadStore:
    return MemoryPayloads() if request.param == "memory" else space


def segments(space: SegmentSpace) -> list[Path]:
    return sorted(space.root.iterdir())


def weights() -> np.ndarray:
    return np.arange(FLOATS, dtype=np.float32)


async def leased(fake: FakeFleet, tmp_path: Path) -> tuple[int, LeasedMessage]:
    """A node registered with ``fake``, and a large message pulled for it."""
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    node_id = await fake.register_node({}, 10.0)
    fake.send(1, train(node_id, RecordDict({"arrays": ArrayRecord({"w": weights()})})))
    (message,) = (await fake.pull_messages(node_id)).messages
    assert message.payload is not None
    return node_id, message


async def pull(fake: FakeFleet, node_id: int, message: LeasedMessage, store: PayloadStore) -> None:
    assert message.payload is not None
    await with_payload(fake, node_id, message.message, message.payload, store)


async def test_a_payload_lands_in_a_segment_and_goes_with_its_content(
    fake: FakeFleet, space: SegmentSpace, tmp_path: Path
) -> None:
    node_id, message = await leased(fake, tmp_path)
    assert message.payload is not None
    fetched = await with_payload(fake, node_id, message.message, message.payload, space)
    (path,) = segments(space)
    assert path.stat().st_size == message.payload.digest.size
    got = fetched.content["arrays"]["w"]
    np.testing.assert_array_equal(got, weights())
    assert not got.flags.writeable
    assert space.content_segment(fetched.content) == path.name  # what the pool will name
    del fetched
    gc.collect()
    assert segments(space) == []
    assert float(got[-1]) == FLOATS - 1  # the mapping outlives the name while views remain


async def test_a_payload_over_the_cap_is_refused_before_anything_is_made(
    fake: FakeFleet, store: PayloadStore, space: SegmentSpace, tmp_path: Path
) -> None:
    node_id, message = await leased(fake, tmp_path)
    huge = PayloadRef(
        message.payload.payload_id if message.payload else "",
        Digest(DEFAULT_LIMITS.max_bytes + 1, hashlib.sha256(b"").digest()),
    )
    with pytest.raises(DecodeError, match="over the cap"):
        await with_payload(fake, node_id, message.message, huge, store)
    assert segments(space) == []


async def test_a_payload_other_than_announced_is_refused(
    fake: FakeFleet, store: PayloadStore, space: SegmentSpace, tmp_path: Path
) -> None:
    node_id, message = await leased(fake, tmp_path)
    assert message.payload is not None
    other = Digest(message.payload.digest.size, hashlib.sha256(b"another").digest())
    wrong = PayloadRef(message.payload.payload_id, other)
    with pytest.raises(DecodeError, match="not the one the message announced"):
        await with_payload(fake, node_id, message.message, wrong, store)
    assert segments(space) == []


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        (lambda data: data + b"extra", "runs past its"),
        (lambda data: data[:-5], "ended after"),
        (lambda data: b"\xff" * len(data), "not a fedcore payload"),  # right size, no RecordDict
    ],
    ids=["overrun", "short", "garbage"],
)
async def test_a_bad_payload_is_refused_and_discarded(
    fake: FakeFleet,
    store: PayloadStore,
    space: SegmentSpace,
    tmp_path: Path,
    tamper: Callable[[bytes], bytes],
    error: str,
) -> None:
    node_id, message = await leased(fake, tmp_path)
    assert message.payload is not None
    stored = fake.payloads[message.payload.payload_id]
    stored.parts = [tamper(b"".join(bytes(part) for part in stored.parts))]
    with pytest.raises(DecodeError, match=error):
        await pull(fake, node_id, message, store)
    assert segments(space) == []


async def test_a_node_with_a_segment_store_serves_large_contents(
    fake: FakeFleet, fake_clock: FakeClock, space: SegmentSpace, tmp_path: Path
) -> None:
    seen: list[np.ndarray] = []
    client = ClientApp()

    @client.train()
    async def double(msg: Message, context: Context) -> Message:
        seen.append(msg.content["arrays"]["w"])
        assert len(segments(space)) == 1  # the payload, in one segment while it is handled
        return Message(RecordDict({"arrays": ArrayRecord({"w": seen[-1] * 2})}), reply_to=msg)

    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": client})
    async with node(fake, fake_clock, tmp_path / "cache", runners, payload_store=space) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(
            1, train(node_id, RecordDict({"arrays": ArrayRecord({"w": weights()})}))
        )
        await until(lambda: message_id in fake.replies)
    assert fake.replies[message_id].payload is not None
    np.testing.assert_array_equal(seen[0], weights())
    assert not seen[0].flags.writeable
    gc.collect()
    assert segments(space) == []  # the message is done with: its segment went with it


async def test_a_full_shared_memory_is_a_resource_error_and_leaves_nothing(
    fake: FakeFleet, space: SegmentSpace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_id, message = await leased(fake, tmp_path)
    monkeypatch.setattr(shared_memory.os, "pwrite", no_space)
    with pytest.raises(ResourceError, match=r"no room for a payload of .* --shm-size"):
        await pull(fake, node_id, message, space)
    assert segments(space) == []


async def test_a_node_without_room_for_a_content_answers_with_an_error(
    fake: FakeFleet,
    fake_clock: FakeClock,
    space: SegmentSpace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redelivered, the content would not fit either: the ServerApp hears it in its round."""
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": ClientApp()})
    monkeypatch.setattr(shared_memory.os, "pwrite", no_space)
    async with node(fake, fake_clock, tmp_path / "cache", runners, payload_store=space) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(
            1, train(node_id, RecordDict({"arrays": ArrayRecord({"w": weights()})}))
        )
        await until(lambda: message_id in fake.replies)
    reply = fake.replies[message_id].reply
    assert reply.has_error()
    assert reply.error.code == ErrorCode.UNKNOWN
    assert "cannot hold the message's content: no room" in reply.error.reason
    assert segments(space) == []


def no_space(descriptor: int, data: object, offset: int) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_a_node_answers_a_value_over_its_cap_with_an_error_and_keeps_one_under_it(
    fake: FakeFleet,
    fake_clock: FakeClock,
    store: PayloadStore,
    space: SegmentSpace,
    tmp_path: Path,
) -> None:
    """Redelivered, the value would be over the cap again: the ServerApp hears it at once."""
    cap = 2 << 20
    seen: list[int] = []
    client = ClientApp()

    @client.train()
    def echo(msg: Message, context: Context) -> Message:
        seen.append(len(msg.content["config"]["model"]))
        return Message(RecordDict(), reply_to=msg)

    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": client})
    options = {"payload_store": store, "max_value_len": cap}
    async with node(fake, fake_clock, tmp_path / "cache", runners, **options) as serving:
        node_id = await serving.wait_registered()
        sent = [
            fake.send(1, train(node_id, RecordDict({"config": ConfigRecord({"model": value})})))
            for value in (b"u" * cap, b"o" * (cap + 1))
        ]
        await until(lambda: all(message_id in fake.replies for message_id in sent))
    under, over = (fake.replies[message_id].reply for message_id in sent)
    assert under.has_content()
    assert seen == [cap]
    assert over.has_error()
    assert over.error.code == ErrorCode.UNKNOWN
    assert "cannot hold the message's content" in over.error.reason
    assert f"'model' of {cap + 1} bytes is over the cap of {cap}" in over.error.reason
    gc.collect()
    assert segments(space) == []
