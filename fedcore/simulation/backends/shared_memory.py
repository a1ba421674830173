"""Shared-memory segments: how large payloads cross between the engine and its workers.

A segment is a file in ``/dev/shm`` (a memory-backed file system; elsewhere, the
temporary directory), written once by its creator and mapped read-only by its
reader. Decoding a payload from a mapping yields numpy arrays that are views of
the mapped pages: no copy on the receiving side, and the pages are released when
the last array over them is gone.

Names are ``fedcore-<pid>-<pool>-<n>`` (a worker's add ``w<index>-``), so that the
owner of a pool can remove every segment it or its workers may have left — after a
worker crash, say — with :meth:`SegmentSpace.remove_all`. A reader that takes
ownership unlinks the name as soon as it has mapped the segment; the mapping
outlives the name.

The standard library's ``multiprocessing.shared_memory`` is not used: its resource
tracker unlinks segments that another process still needs and warns about ones it
did not create, and its mapping cannot outlive the object that created it while
arrays still point into it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import secrets
import tempfile
from pathlib import Path

from fedcore.wire import Parts, parts_size

ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class SegmentSpace:
    """The segments of one pool: names, creation, cleanup."""

    def __init__(self, root: Path = ROOT, prefix: str | None = None) -> None:
        self.root = root
        self.prefix = prefix or f"fedcore-{os.getpid()}-{secrets.token_hex(4)}-"
        self._numbers = itertools.count()

    def write(self, parts: Parts) -> str:
        """Write a payload into a new segment and return its name."""
        name = f"{self.prefix}{next(self._numbers)}"
        write_segment(self.root / name, parts)
        return name

    def remove_all(self) -> int:
        """Unlink every segment of this space that still exists; return how many."""
        removed = 0
        for path in self.root.glob(f"{self.prefix}*"):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed


def write_segment(path: Path, parts: Parts) -> None:
    """Create ``path`` holding the concatenation of ``parts``, copying each part once."""
    size = parts_size(parts)
    descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(descriptor, size)
        with mmap.mmap(descriptor, size) as mapped:
            position = 0
            for part in parts:
                length = part.nbytes if isinstance(part, memoryview) else len(part)
                mapped[position : position + length] = part
                position += length
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(descriptor)


def map_segment(path: Path, *, take: bool) -> memoryview:
    """Map ``path`` read-only; with ``take``, unlink the name at once (the mapping stays).

    Arrays decoded from the returned view keep the mapping alive as long as they live.
    """
    descriptor = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(descriptor).st_size
        mapped = mmap.mmap(descriptor, size, access=mmap.ACCESS_READ)
    finally:
        os.close(descriptor)
        if take:
            path.unlink(missing_ok=True)
    return memoryview(mapped)
