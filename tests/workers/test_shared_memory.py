"""Shared-memory segments: writing, mapping, taking, reusing and cleaning up."""

from __future__ import annotations

import gc
import os
import stat
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from fedcore.domain import Array, ArrayRecord, ConfigRecord, RecordDict
from fedcore.domain.array import SerializedArray
from fedcore.wire import Parts, pack_recorddict_parts, parts_size, unpack_recorddict
from fedcore.wire.worker import check_segment_name
from fedcore.workers import shared_memory
from fedcore.workers.shared_memory import (
    ROOT,
    SegmentSpace,
    map_segment,
    write_segment,
)


def joined(parts: Sequence[bytes | memoryview]) -> bytes:
    return b"".join(bytes(memoryview(part).cast("B")) for part in parts)


def read(path: Path, *, take: bool = False) -> bytes:
    mapped = map_segment(path, take=take)
    try:
        return bytes(mapped)
    finally:
        mapped.close()


@pytest.fixture
def space(tmp_path: Path) -> SegmentSpace:
    return SegmentSpace(root=tmp_path)


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """No umask, so a file's mode is exactly the one it was created with."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# ---------------------------------------------------------------- write and map


def test_parts_round_trip_through_a_segment(space: SegmentSpace) -> None:
    floats = np.linspace(-1, 1, 1001)
    ints = np.arange(24, dtype=">i4").reshape(2, 3, 4)
    parts: Parts = [b"head", floats.data, b"", ints.data, bytes(range(256))]
    name = space.write(parts)
    expected = b"head" + floats.tobytes() + ints.tobytes() + bytes(range(256))
    assert (space.root / name).stat().st_size == len(expected) == parts_size(parts)
    assert read(space.root / name) == expected


def test_a_single_part_and_no_parts(space: SegmentSpace) -> None:
    one = space.write([b"x" * 100_000])
    assert read(space.root / one) == b"x" * 100_000
    empty = space.write([])
    assert (space.root / empty).stat().st_size == 0


@pytest.mark.parametrize("count", [1023, 1024, 1025, 3000])
def test_more_parts_than_one_writev_takes(space: SegmentSpace, count: int) -> None:
    parts: Parts = [bytes([i % 251]) * (i % 7) for i in range(count)]
    parts[-1] = np.full(5, count, dtype=np.int64).data
    name = space.write(parts)
    assert read(space.root / name) == joined(parts)


@pytest.mark.timeout(30)  # a resume that makes no progress would loop forever
def test_short_writes_are_resumed_where_they_stopped(
    space: SegmentSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwritev = os.pwritev
    batches: list[int] = []

    def short_pwritev(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        # Write at most 5 bytes per call, as a kernel under pressure may.
        batches.append(len(buffers))
        first = bytes(buffers[0])[:5] if buffers else b""
        return real_pwritev(fd, [first], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    parts: Parts = [bytes([i % 256]) * (i % 13) for i in range(1500)]
    parts.append(np.arange(100, dtype=np.float32).data)
    name = space.write(parts)
    monkeypatch.undo()
    assert read(space.root / name) == joined(parts)
    assert max(batches) <= 1024
    assert len(batches) >= parts_size(parts) // 5


def test_take_unlinks_the_name_but_the_mapping_stays_readable(space: SegmentSpace) -> None:
    name = space.write([b"payload" * 1000])
    path = space.root / name
    mapped = map_segment(path, take=True)
    try:
        assert not path.exists()
        assert bytes(mapped) == b"payload" * 1000
        assert mapped[:7] == b"payload"
    finally:
        mapped.close()


def test_without_take_the_name_stays(space: SegmentSpace) -> None:
    name = space.write([b"kept"])
    mapped = map_segment(space.root / name, take=False)
    try:
        assert (space.root / name).exists()
        assert bytes(mapped) == b"kept"
        # A mapping outlives the removal of its segment, as after a worker's crash.
        assert space.remove_all() == 1
        assert bytes(mapped) == b"kept"
    finally:
        mapped.close()


def test_mappings_are_read_only(space: SegmentSpace) -> None:
    name = space.write([b"abc"])
    mapped = map_segment(space.root / name, take=True)
    try:
        with pytest.raises(TypeError):
            mapped[0] = 0
        with pytest.raises(TypeError):
            mapped.write(b"z")
        assert memoryview(mapped).readonly
    finally:
        mapped.close()


def test_mapping_a_missing_segment_raises(space: SegmentSpace) -> None:
    with pytest.raises(FileNotFoundError):
        map_segment(space.root / space.new_name(), take=True)


# ---------------------------------------------------------------- reuse


def test_reuse_overwrites_in_place_and_truncates(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    write_segment(path, [b"L" * 50_000, np.arange(1000, dtype=np.int64).data])
    inode = path.stat().st_ino
    short: Parts = [b"short", np.array([1.5, -2.5]).data]
    write_segment(path, short, reuse=True)
    assert path.stat().st_size == len(joined(short))
    assert read(path) == joined(short)
    assert path.stat().st_ino == inode  # the same file, not a new one under the name
    write_segment(path, [b"G" * 70_000], reuse=True)
    assert read(path) == b"G" * 70_000


def test_reuse_creates_a_segment_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "fresh"
    write_segment(path, [b"new"], reuse=True)
    assert read(path) == b"new"


def test_without_reuse_an_existing_segment_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    write_segment(path, [b"original contents"])
    with pytest.raises(FileExistsError):
        write_segment(path, [b"other"])
    with pytest.raises(FileExistsError):
        write_segment(path, [b"much longer other contents than before"])
    assert read(path) == b"original contents"


def test_a_failed_new_segment_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    not_contiguous: Parts = [b"abc", np.asfortranarray(np.ones((3, 3))).data]
    with pytest.raises(TypeError):
        write_segment(path, not_contiguous)
    assert not path.exists()


def test_a_failed_reuse_keeps_the_segment(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    write_segment(path, [b"abc"])
    not_contiguous: Parts = [b"xyz", np.asfortranarray(np.ones((3, 3))).data]
    with pytest.raises(TypeError):
        write_segment(path, not_contiguous, reuse=True)
    assert path.exists()


@pytest.mark.usefixtures("umask_zero")
@pytest.mark.parametrize("reuse", [False, True])
def test_segments_are_private_to_their_owner(tmp_path: Path, reuse: bool) -> None:
    path = tmp_path / "segment"
    write_segment(path, [b"secret"], reuse=reuse)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# ---------------------------------------------------------------- names and cleanup


def test_names_are_unique_and_carry_the_prefix(space: SegmentSpace) -> None:
    names = [space.new_name() for _ in range(1000)]
    assert len(set(names)) == 1000
    assert all(name.startswith(space.prefix) for name in names)
    assert all(check_segment_name(name) == name for name in names)
    written = {space.write([b"x"]) for _ in range(5)}
    assert len(written) == 5
    assert not written & set(names)


def test_default_prefixes_name_the_process_and_differ_between_spaces(tmp_path: Path) -> None:
    first, second = SegmentSpace(root=tmp_path), SegmentSpace(root=tmp_path)
    assert first.prefix.startswith(f"fedcore-{os.getpid()}-")
    assert first.prefix.endswith("-")
    assert first.prefix != second.prefix
    assert first.new_name() != second.new_name()
    # A worker's prefix extends its pool's; its names are valid segment names too.
    worker = SegmentSpace(root=tmp_path, prefix=f"{first.prefix}w3-")
    assert check_segment_name(worker.new_name()).startswith(first.prefix)


def test_remove_all_removes_only_this_spaces_segments(space: SegmentSpace) -> None:
    own = [space.write([b"own"]) for _ in range(3)]
    worker_1 = SegmentSpace(space.root, f"{space.prefix}w1-")
    worker_10 = SegmentSpace(space.root, f"{space.prefix}w10-")
    of_worker_1 = [worker_1.write([b"w1"]) for _ in range(2)]
    of_worker_10 = worker_10.write([b"w10"])
    neighbour = SegmentSpace(space.root)
    foreign = [neighbour.write([b"theirs"]), "unrelated-file", "fedcore-1-x"]
    for name in foreign[1:]:
        (space.root / name).write_bytes(b"not ours")

    assert space.remove_all(worker_1.prefix) == 2
    assert not any((space.root / name).exists() for name in of_worker_1)
    assert (space.root / of_worker_10).exists()
    assert all((space.root / name).exists() for name in own)

    assert space.remove_all() == 4
    assert sorted(path.name for path in space.root.iterdir()) == sorted(foreign)
    assert space.remove_all() == 0
    assert neighbour.remove_all() == 1


def test_the_default_root_is_shared_memory_and_is_cleaned_up() -> None:
    if Path("/dev/shm").is_dir():
        assert Path("/dev/shm") == ROOT
    space = SegmentSpace()
    assert space.root == ROOT == shared_memory.ROOT
    try:
        name = space.write([b"in ", np.arange(3, dtype=np.uint8).data])
        assert (ROOT / name).is_file()
        assert read(ROOT / name, take=True) == b"in \x00\x01\x02"
        assert not (ROOT / name).exists()
        kept = space.write([b"left behind"])
        assert (ROOT / kept).is_file()
    finally:
        removed = space.remove_all()
    assert removed == 1
    assert not list(ROOT.glob(f"{space.prefix}*"))


# ---------------------------------------------------------------- mapping lifetime


def test_the_mapping_is_released_when_the_last_decoded_array_goes(space: SegmentSpace) -> None:
    weights = np.arange(50_000, dtype=np.float32)
    arrays = ArrayRecord([weights, np.ones(3)])
    records = RecordDict({"model": arrays, "c": ConfigRecord({"k": 1})})
    name = space.write(pack_recorddict_parts(records))
    mapped = map_segment(space.root / name, take=True)
    released: list[str] = []
    weakref.finalize(mapped, released.append, name)

    decoded = unpack_recorddict(memoryview(mapped))
    del mapped
    gc.collect()
    assert released == [], "released while the decoded records still point into it"
    assert decoded == records

    w = decoded.array_records["model"]["0"]
    assert not w.flags.writeable
    del decoded
    gc.collect()
    assert released == [], "released while one array still points into it"
    np.testing.assert_array_equal(w, weights)

    del w
    gc.collect()
    assert released == [name]


def test_a_mapping_nothing_was_decoded_from_is_released_at_once(space: SegmentSpace) -> None:
    name = space.write([b"unused"])
    mapped = map_segment(space.root / name, take=False)
    finalizer = weakref.finalize(mapped, lambda: None)
    assert finalizer.alive
    del mapped
    gc.collect()
    assert not finalizer.alive


def test_a_serialized_array_comes_out_of_a_segment_as_itself(space: SegmentSpace) -> None:
    # A legacy tensor of strings (kept as given) handed to workers through shared memory:
    # its bytes are copied out, so the mapping goes while the array lives.
    fields = ("", (), "numpy.ndarray", bytes(range(256)) * 512)
    records = RecordDict({"fitins.parameters": ArrayRecord({"0": Array(*fields)})})
    name = space.write(pack_recorddict_parts(records))
    mapped = map_segment(space.root / name, take=True)
    released: list[str] = []
    weakref.finalize(mapped, released.append, name)

    kept = unpack_recorddict(memoryview(mapped)).array_records["fitins.parameters"]["0"]
    del mapped
    gc.collect()

    assert isinstance(kept, SerializedArray)
    assert (kept.dtype, kept.shape, kept.stype, kept.data) == fields
    assert released == [name]
