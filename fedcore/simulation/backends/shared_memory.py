"""Shared-memory segments: how large payloads cross between the engine and its workers.

A segment is a file in ``/dev/shm`` (a memory-backed file system; elsewhere, the
temporary directory), written once by its creator and mapped read-only by its
reader. Decoding a payload from a mapping yields numpy arrays that are views of
the mapped pages: no copy on the receiving side, and the pages are released when
the last array over them is gone.

Names are ``fedcore-<pid>-<pool>-<n>`` (a worker's add ``w<n>-``), so that the
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

from fedcore.wire import Parts

ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
# Fault the pages in with the mapping (Linux): a payload is always read whole.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class SegmentSpace:
    """The segments of one pool: names, creation, cleanup."""

    def __init__(self, root: Path = ROOT, prefix: str | None = None) -> None:
        self.root = root
        self.prefix = prefix or f"fedcore-{os.getpid()}-{secrets.token_hex(4)}-"
        self._numbers = itertools.count()

    def new_name(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"

    def write(self, parts: Parts) -> str:
        """Write a payload into a new segment and return its name."""
        name = self.new_name()
        write_segment(self.root / name, parts)
        return name

    def remove_all(self, prefix: str | None = None) -> int:
        """Unlink every segment of this space (or those under ``prefix``); return how many."""
        removed = 0
        for path in self.root.glob(f"{prefix or self.prefix}*"):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed


_IOV_MAX = 1024


def write_segment(path: Path, parts: Parts, *, reuse: bool = False) -> None:
    """Write the concatenation of ``parts`` into ``path``, copying each part once.

    A new segment unless ``reuse``, which overwrites an existing one in place — its
    pages are already allocated, which makes writing several times faster than
    into fresh ones. ``writev`` rather than a writable mapping: the kernel copies
    straight into the file's pages instead of taking a page fault for each.
    """
    flags = os.O_CREAT | os.O_WRONLY | (0 if reuse else os.O_EXCL)
    descriptor = os.open(path, flags, 0o600)
    try:
        pending = [memoryview(part).cast("B") for part in parts]
        size = sum(part.nbytes for part in pending)
        position = 0
        while pending:
            written = os.pwritev(descriptor, pending[:_IOV_MAX], position)
            position += written
            while pending and written >= pending[0].nbytes:
                written -= pending.pop(0).nbytes
            if pending and written:
                pending[0] = pending[0][written:]
        if reuse:
            os.ftruncate(descriptor, size)
    except BaseException:
        if not reuse:
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(descriptor)


def map_segment(path: Path, *, take: bool) -> mmap.mmap:
    """Map ``path`` read-only; with ``take``, unlink the name at once (the mapping stays).

    Arrays decoded from the mapping keep it alive as long as they live; it is unmapped
    when the last of them goes (a ``weakref.finalize`` on it says when).
    """
    descriptor = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(descriptor).st_size
        mapped = mmap.mmap(descriptor, size, flags=_MAP_FLAGS, prot=mmap.PROT_READ)
    finally:
        os.close(descriptor)
        if take:
            path.unlink(missing_ok=True)
    return mapped
