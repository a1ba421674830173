"""The link's fleet API over a LinkState: long-poll pulls, lease renewal, payloads, visibility."""

from __future__ import annotations

import gc
import hashlib
import math
import mmap
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Message, RecordDict
from fedcore.domain import Run, RunStatus
from fedcore.domain.fleet import Digest, PayloadRef
from fedcore.errors import (
    ConflictError,
    DecodeError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    RunNotFoundError,
)
from fedcore.roles.link.fleet import LinkFleet
from fedcore.state.base import DEFAULT_HEARTBEAT_PATIENCE
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock
from fedcore.testing.arrays import backing
from fedcore.wire import pack_recorddict_parts, unpack_recorddict

pytestmark = pytest.mark.anyio

BUNDLE = b"PK not really a zip, the fleet only relays it" * 100


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


@pytest.fixture
def fleet(state: InMemoryLinkState, fake_clock: FakeClock) -> LinkFleet:
    return LinkFleet(state, fake_clock, default_lease=10.0, inline_limit=1024, chunk_size=4096)


@pytest.fixture
async def run(state: InMemoryLinkState) -> Run:
    bundle_hash = await state.put_bundle(BUNDLE)
    run = await state.create_run({}, bundle_hash=bundle_hash)
    await state.update_run_status(run.run_id, RunStatus.STARTING)
    return await state.update_run_status(run.run_id, RunStatus.RUNNING)


def _message(node_id: int, content: RecordDict | None = None) -> Message:
    return Message(content or RecordDict({"config": ConfigRecord({"x": 1})}), node_id, "train")


def _big() -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.arange(5000, dtype=np.float32)})})


async def test_a_pull_waits_for_a_message_and_wakes_when_it_is_pushed(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run, fake_clock: FakeClock
) -> None:
    node = await fleet.register_node({"partition-id": 0}, 1.0)
    async with anyio.create_task_group() as tasks:
        pulled = []

        async def pull() -> None:
            pulled.append(await fleet.pull_messages(node, limit=1, wait_seconds=30.0))

        tasks.start_soon(pull)
        await anyio.wait_all_tasks_blocked()
        assert not pulled
        (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    (result,) = pulled
    assert [leased.message.metadata.message_id for leased in result.messages] == [message_id]
    assert result.messages[0].lease_expires_at == pytest.approx(fake_clock.now() + 10.0)


async def test_a_pull_with_nothing_returns_empty_when_its_wait_ends(
    fleet: LinkFleet, fake_clock: FakeClock
) -> None:
    node = await fleet.register_node({}, 1.0)
    async with anyio.create_task_group() as tasks:
        pulled = []

        async def pull() -> None:
            pulled.append(await fleet.pull_messages(node, wait_seconds=0.5))

        tasks.start_soon(pull)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(0.4)
        await anyio.wait_all_tasks_blocked()
        assert not pulled
        fake_clock.advance(0.2)
    assert pulled[0].messages == ()


async def test_heartbeats_renew_the_leases_of_messages_being_worked_on(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run, fake_clock: FakeClock
) -> None:
    node = await fleet.register_node({}, 1.0)
    await state.push_messages(run.run_id, [_message(node)])
    (leased,) = (await fleet.pull_messages(node, lease_seconds=2.0)).messages
    message_id = leased.message.metadata.message_id
    for _ in range(5):
        fake_clock.advance(1.0)
        assert await fleet.heartbeat(node, 1.0, [message_id], lease_seconds=2.0) == []
    assert (await fleet.pull_messages(node)).messages == ()  # still leased, not redelivered
    assert await fleet.heartbeat(node, 1.0, ["unknown"], lease_seconds=2.0) == ["unknown"]
    with pytest.raises(DecodeError, match="lease"):
        await fleet.heartbeat(node, 1.0, [message_id])


async def test_an_unleased_message_comes_back_after_its_lease(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run, fake_clock: FakeClock
) -> None:
    node = await fleet.register_node({}, 100.0)
    await state.push_messages(run.run_id, [_message(node)])
    first = (await fleet.pull_messages(node, lease_seconds=2.0)).messages
    fake_clock.advance(2.5)
    again = (await fleet.pull_messages(node)).messages
    assert [m.message.metadata.message_id for m in again] == [
        m.message.metadata.message_id for m in first
    ]


async def test_replies_are_stored_once_and_a_conflict_is_refused(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    node = await fleet.register_node({}, 1.0)
    (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    (leased,) = (await fleet.pull_messages(node)).messages

    def reply(value: int) -> Message:
        return Message(RecordDict({"config": ConfigRecord({"y": value})}), reply_to=leased.message)

    first = await fleet.push_reply(node, reply(1))
    again = await fleet.push_reply(node, reply(1))
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.reply_id == first.reply_id
    with pytest.raises(ConflictError):
        await fleet.push_reply(node, reply(2))
    (stored,) = await state.get_replies(run.run_id, [message_id])
    assert stored.content["config"]["y"] == 1


async def test_a_large_content_goes_as_one_payload_shared_by_every_node(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    nodes = [await fleet.register_node({}, 1.0) for _ in range(3)]
    content = _big()
    await state.push_messages(run.run_id, [_message(n, content) for n in nodes])
    refs = []
    for node in nodes:
        (leased,) = (await fleet.pull_messages(node)).messages
        assert leased.payload is not None
        refs.append(leased.payload)
    assert len({ref.payload_id for ref in refs}) == 1
    expected = Digest.of(pack_recorddict_parts(content))
    assert refs[0].digest == expected
    async with fleet.pull_payload(nodes[1], refs[0].payload_id) as transfer:
        data = b"".join([bytes(chunk) async for chunk in transfer.chunks])
    assert hashlib.sha256(data).digest() == expected.sha256
    np.testing.assert_array_equal(unpack_recorddict(data)["arrays"]["w"], content["arrays"]["w"])


async def test_a_payload_is_not_handed_to_another_node(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    owner = await fleet.register_node({}, 1.0)
    other = await fleet.register_node({}, 1.0)
    await state.push_messages(run.run_id, [_message(owner, _big())])
    (leased,) = (await fleet.pull_messages(owner)).messages
    assert leased.payload is not None
    with pytest.raises(NotFoundError):
        async with fleet.pull_payload(other, leased.payload.payload_id):
            pass
    with pytest.raises(NodeNotFoundError):
        async with fleet.pull_payload(12345, leased.payload.payload_id):
            pass


async def test_a_large_reply_arrives_through_a_pushed_payload(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    node = await fleet.register_node({}, 1.0)
    (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    (leased,) = (await fleet.pull_messages(node)).messages
    content = _big()
    parts = pack_recorddict_parts(content)
    digest = Digest.of(parts)
    payload_id = await fleet.push_payload(node, message_id, digest, parts)
    empty = Message(RecordDict(), reply_to=leased.message)
    await fleet.push_reply(node, empty, PayloadRef(payload_id, digest))
    (stored,) = await state.get_replies(run.run_id, [message_id])
    np.testing.assert_array_equal(stored.content["arrays"]["w"], content["arrays"]["w"])
    assert isinstance(backing(stored.content["arrays"]["w"]), mmap.mmap), "not spooled"


@pytest.mark.parametrize("over", [False, True])
async def test_a_reply_with_a_value_over_the_links_cap_is_refused(
    state: InMemoryLinkState, fake_clock: FakeClock, run: Run, over: bool
) -> None:
    cap = 2 << 20
    fleet = LinkFleet(state, fake_clock, max_value_len=cap)
    node = await fleet.register_node({}, 1.0)
    (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    (leased,) = (await fleet.pull_messages(node)).messages
    value = b"v" * (cap + over)
    parts = pack_recorddict_parts(RecordDict({"config": ConfigRecord({"model": value})}))
    digest = Digest.of(parts)
    payload_id = await fleet.push_payload(node, message_id, digest, parts)
    empty = Message(RecordDict(), reply_to=leased.message)
    if over:
        with pytest.raises(DecodeError, match=f"{cap + 1} bytes is over the cap of {cap}"):
            await fleet.push_reply(node, empty, PayloadRef(payload_id, digest))
        assert await state.get_replies(run.run_id, [message_id]) == []
        return
    await fleet.push_reply(node, empty, PayloadRef(payload_id, digest))
    (stored,) = await state.get_replies(run.run_id, [message_id])
    assert stored.content["config"]["model"] == value


async def test_a_payload_with_wrong_bytes_or_for_a_foreign_message_is_refused(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    node = await fleet.register_node({}, 1.0)
    other = await fleet.register_node({}, 1.0)
    (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    await fleet.pull_messages(node)
    digest = Digest.of(b"right")
    with pytest.raises(DecodeError):
        await fleet.push_payload(node, message_id, digest, [b"wrong"])
    with pytest.raises(MessageNotFoundError):
        await fleet.push_payload(other, message_id, digest, [b"right"])


async def test_a_new_push_for_a_message_replaces_and_frees_the_one_before(
    fleet: LinkFleet,
    state: InMemoryLinkState,
    run: Run,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the spools are
    node = await fleet.register_node({}, 1.0)
    (message_id,) = await state.push_messages(run.run_id, [_message(node)])
    (leased,) = (await fleet.pull_messages(node)).messages
    contents = [
        RecordDict({"arrays": ArrayRecord({"w": np.full(5000, i, np.float32)})}) for i in range(5)
    ]
    pushed = []
    for content in contents:
        parts = pack_recorddict_parts(content)
        digest = Digest.of(parts)
        pushed.append((await fleet.push_payload(node, message_id, digest, parts), digest))
        gc.collect()
        assert _spools_mapped(tmp_path) == 1, "a replaced payload is still held"
    empty = Message(RecordDict(), reply_to=leased.message)
    for payload_id, digest in pushed[:-1]:
        with pytest.raises(DecodeError):
            await fleet.push_reply(node, empty, PayloadRef(payload_id, digest))
    await fleet.push_reply(node, empty, PayloadRef(*pushed[-1]))
    (stored,) = await state.get_replies(run.run_id, [message_id])
    np.testing.assert_array_equal(stored.content["arrays"]["w"], contents[-1]["arrays"]["w"])


def _spools_mapped(directory: Path) -> int:
    """Spool files of ``directory`` this process still maps (unlinked, they show as deleted)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return len({line.split()[-2] for line in maps if str(directory) in line})


async def test_a_node_sees_only_runs_it_has_messages_of_and_their_bundles(
    fleet: LinkFleet, state: InMemoryLinkState, run: Run
) -> None:
    node = await fleet.register_node({}, 1.0)
    with pytest.raises(RunNotFoundError):
        await fleet.get_run(node, run.run_id)
    await state.push_messages(run.run_id, [_message(node)])
    await fleet.pull_messages(node)
    got, digest = await fleet.get_run(node, run.run_id)
    assert got.run_id == run.run_id
    assert digest == Digest.of(BUNDLE)
    async with fleet.get_bundle(node, run.run_id) as transfer:
        data = b"".join([bytes(chunk) async for chunk in transfer.chunks])
    assert data == BUNDLE
    with pytest.raises(NodeNotFoundError):
        await fleet.get_run(999, run.run_id)


async def test_unregistering_is_idempotent_and_ends_the_node(
    fleet: LinkFleet, state: InMemoryLinkState
) -> None:
    node = await fleet.register_node({}, 1.0)
    await fleet.unregister_node(node)
    await fleet.unregister_node(node)
    with pytest.raises(NodeNotFoundError):
        await fleet.heartbeat(node, 1.0)


@pytest.mark.parametrize("interval", [0.0, -1.0, math.inf, math.nan])
async def test_registration_refuses_a_bad_heartbeat_interval(
    fleet: LinkFleet, interval: float
) -> None:
    with pytest.raises(DecodeError, match="heartbeat_interval"):
        await fleet.register_node({}, interval)


async def test_a_heartbeat_interval_over_the_bound_is_refused_at_registration_and_beat(
    state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    fleet = LinkFleet(state, fake_clock, max_heartbeat_interval=2.0)
    with pytest.raises(DecodeError, match=r"over the link's bound of 2 s .*max-heartbeat-interval"):
        await fleet.register_node({}, 1e9, b"key of a node that never beats")
    assert await state.get_node_ids() == []
    node = await fleet.register_node({}, 2.0, b"key of a node at the bound")
    with pytest.raises(DecodeError, match="over the link's bound"):
        await fleet.heartbeat(node, 2.1)
    fake_clock.advance(DEFAULT_HEARTBEAT_PATIENCE * 2.0 + 0.1)
    assert await state.get_node_ids() == [], "silent past patience × the bound: offline"
