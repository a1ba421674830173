"""Contents received into a segment: the pool names that segment instead of writing another.

A node streams a pulled payload into a segment of a shared space
(:meth:`SegmentSpace.payload_sink`); the process pool built on that space then finds
the content's segment and names it in the task. Segments go with their contents.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedcore.domain import ArrayRecord, Context, Message, RecordDict
from fedcore.testing import FakeClock
from fedcore.wire import pack_recorddict_parts, parts_size
from fedcore.workers.pool import ProcessPoolBackend
from fedcore.workers.shared_memory import SegmentSpace
from fedcore.workers.sizing import PoolPlan

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
FLOATS = 100_000
"""float32s: 400 KB, well over what a task carries inline."""


@pytest.fixture
def space(tmp_path: Path) -> Iterator[SegmentSpace]:
    space = SegmentSpace(root=tmp_path)
    yield space
    space.remove_all()


def files(space: SegmentSpace) -> list[str]:
    return sorted(path.name for path in space.root.glob(f"{space.prefix}*"))


def model() -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.arange(FLOATS, dtype=np.float32)})})


def received(space: SegmentSpace, content: RecordDict, piece: int = 65_536) -> RecordDict:
    """``content`` as a node gets it: its encoding streamed in pieces into a sink, decoded."""
    data = b"".join(bytes(memoryview(part).cast("B")) for part in pack_recorddict_parts(content))
    sink = space.payload_sink(len(data))
    for offset in range(0, len(data), piece):
        sink.write(offset, data[offset : offset + piece])
    return sink.decode()


def backend(space: SegmentSpace | None, clock: FakeClock) -> ProcessPoolBackend:
    return ProcessPoolBackend("segment_apps:client", HERE, PoolPlan(1, ()), clock, space=space)


async def total_of(pool: ProcessPoolBackend, content: RecordDict, clock: FakeClock) -> float:
    message = Message(content, 7, "train")
    message.metadata.created_at = clock.now()
    reply, _ = await pool.run(message, Context(run_id=1, node_id=7))
    assert reply.has_content(), reply.error
    return float(reply.content["metrics"]["total"])  # type: ignore[arg-type]


def test_a_received_content_is_decoded_in_place_from_its_segment(space: SegmentSpace) -> None:
    content = received(space, model())
    (name,) = files(space)
    weights = content["arrays"]["w"]
    np.testing.assert_array_equal(weights, np.arange(FLOATS, dtype=np.float32))
    assert not weights.flags.writeable
    assert space.content_segment(content) == name
    assert space.content_segment(model()) is None


def test_the_segment_is_unlinked_once_the_content_is_collected(space: SegmentSpace) -> None:
    content = received(space, model())
    weights = content["arrays"]["w"]
    assert len(files(space)) == 1
    del content
    gc.collect()
    assert files(space) == []
    # The mapping outlives the name: arrays still held stay readable.
    assert float(weights[-1]) == FLOATS - 1


async def test_the_pool_names_the_received_segment_and_writes_none(
    space: SegmentSpace, fake_clock: FakeClock
) -> None:
    content = received(space, model())
    expected = float(np.arange(FLOATS, dtype=np.float32).sum())
    async with backend(space, fake_clock) as pool:
        assert await total_of(pool, content, fake_clock) == expected
        assert await total_of(pool, content, fake_clock) == expected
        assert len(files(space)) == 1, files(space)
        # A content nobody received into a segment is written, once: the count can move.
        other = model()
        assert await total_of(pool, other, fake_clock) == expected
        assert await total_of(pool, other, fake_clock) == expected
        assert len(files(space)) == 2, files(space)
    # Leaving the pool removes what it wrote, not what the node received.
    assert len(files(space)) == 1
    assert space.content_segment(content) is not None
    assert space.content_segment(other) is None


async def test_a_pool_of_its_own_still_writes_a_content_once(fake_clock: FakeClock) -> None:
    content = model()
    assert parts_size(pack_recorddict_parts(content)) > 64 * 1024
    async with backend(None, fake_clock) as pool:
        for _ in range(3):
            assert await total_of(pool, content, fake_clock) == float(content["arrays"]["w"].sum())
        own = pool._space
        assert len(files(own)) == 1
    assert files(own) == []


def test_remove_all_removes_received_segments_and_forgets_them(space: SegmentSpace) -> None:
    content = received(space, model())
    assert space.remove_all() == 1
    assert space.content_segment(content) is None
