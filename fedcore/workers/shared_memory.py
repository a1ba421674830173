"""Shared-memory segments: how large payloads cross between the engine and its workers.

A segment is a file in ``/dev/shm`` (a memory-backed file system; elsewhere, the
temporary directory), written once by its creator and mapped read-only by its
reader. Decoding a payload from a mapping yields numpy arrays that are views of
the mapped pages: no copy on the receiving side, and the pages are released when
the last array over them is gone.

Names are ``fedcore-<pid>-<pool>-<n>`` (a worker's add ``w<n>-``, a
:meth:`~SegmentSpace.subspace`'s ``<n>-``), so that the owner of a pool can remove
every segment it or its workers may have left — after a worker crash, say — with
:meth:`SegmentSpace.remove_all`. A reader that takes ownership unlinks the name as
soon as it has mapped the segment; the mapping outlives the name. The ``<pid>`` is
the process that owns the pool: segments whose owner is gone (it was killed
before it could clean up) are nobody's, and :func:`remove_stale` removes them.

A space also remembers which segment holds the encoding of which message content
(a RecordDict), for as long as that content lives: a content is written once
however many tasks carry it, and a content that was *received* into a segment (a
node's pulled payload, :class:`SegmentSink`) is never written again at all. The
segment is unlinked when its content is garbage-collected. Subspaces share their
parent's memory of contents, so that the node's payloads and each run's pool (a
subspace each, removed on its own when the run's pool stops) see the same.

The standard library's ``multiprocessing.shared_memory`` is not used: its resource
tracker unlinks segments that another process still needs and warns about ones it
did not create, and its mapping cannot outlive the object that created it while
arrays still point into it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import re
import secrets
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedcore.domain import RecordDict
from fedcore.errors import ResourceError
from fedcore.wire import (
    DEFAULT_LIMITS,
    DecodeLimits,
    Parts,
    pack_recorddict_parts,
    unpack_recorddict,
)
from fedcore.wire.frame import Buffer

ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
# Fault the pages in with the mapping (Linux): a payload is always read whole.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


_NAME = re.compile(r"fedcore-(?P<pid>[0-9]+)-[0-9a-f]{8}-")
"""The start of every segment name: ``fedcore-<pid of the pool's owner>-<pool>-``."""

_Contents = dict[int, tuple[weakref.ref[RecordDict], str]]
"""Segments holding contents: by the content's id, a reference to it and the segment's name."""


class SegmentSpace:
    """The segments of one pool: names, creation, the contents they hold, cleanup.

    ``owner`` (uid, gid): the user the segments are made over to as they are created,
    for workers that run as another user (a node's ``--app-user``) and must map them;
    None keeps them this process's user's. Either way a segment is mode 0600.
    """

    def __init__(
        self, root: Path = ROOT, prefix: str | None = None, owner: tuple[int, int] | None = None
    ) -> None:
        self.root = root
        self.prefix = prefix or f"{process_prefix(os.getpid())}{secrets.token_hex(4)}-"
        self.owner = owner
        self._numbers = itertools.count()
        self._contents: _Contents = {}

    def new_name(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"

    def subspace(self) -> SegmentSpace:
        """A space under this one: a prefix of its own, the contents of this one."""
        child = SegmentSpace(self.root, f"{self.new_name()}-", self.owner)
        child._contents = self._contents
        return child

    def write(self, parts: Parts) -> str:
        """Write a payload into a new segment and return its name."""
        name = self.new_name()
        write_segment(self.root / name, parts, owner=self.owner)
        return name

    def content_segment(self, content: RecordDict) -> str | None:
        """The segment known to hold ``content``'s encoding, or ``None``."""
        entry = self._contents.get(id(content))
        if entry is not None and entry[0]() is content:
            return entry[1]
        return None

    def write_content(self, content: RecordDict) -> str:
        """Write ``content``'s encoding into a new segment, remembered while ``content`` lives."""
        name = self.write(pack_recorddict_parts(content))
        self.remember(content, name)
        return name

    def payload_sink(self, size: int) -> SegmentSink:
        """A new segment of ``size`` bytes to receive a content's encoding into."""
        return SegmentSink(self, size)

    def remember(self, content: RecordDict, name: str) -> None:
        """Note that segment ``name`` holds ``content``'s encoding; unlink it with ``content``."""
        self._contents[id(content)] = (weakref.ref(content), name)
        weakref.finalize(content, _forget, self._contents, id(content), self.root / name)

    def remove_all(self, prefix: str | None = None) -> int:
        """Unlink every segment of this space (or those under ``prefix``); return how many.

        The contents they held are forgotten: a later task writes them again.
        """
        prefix = prefix or self.prefix
        for key, (_, name) in self._contents.copy().items():
            if name.startswith(prefix):
                self._contents.pop(key, None)
        return _unlink(self.root.glob(f"{prefix}*"))


def process_prefix(pid: int) -> str:
    """The start of the names of every segment in the pools of process ``pid``."""
    return f"fedcore-{pid}-"


def remove_process_segments(pid: int, root: Path = ROOT) -> int:
    """Unlink every segment of the pools of process ``pid``; return how many.

    For a process that exits at once (a second Ctrl-C), without leaving its pools.
    """
    return _unlink(root.glob(f"{process_prefix(pid)}*"))


def remove_stale(root: Path = ROOT) -> int:
    """Unlink the segments of pools whose owner process is gone; return how many.

    Only names of this module's scheme are touched, and only when their owner's pid
    is unused: a live owner's segments (another simulation, a node) are kept, and so
    are those of a pid reused since, until that process ends too.
    """
    owners: dict[int, bool] = {}
    stale = []
    for path in root.glob("fedcore-*"):
        match = _NAME.match(path.name)
        if match is None:
            continue
        pid = int(match["pid"])
        if pid not in owners:
            owners[pid] = _alive(pid)
        if not owners[pid]:
            stale.append(path)
    return _unlink(stale)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process: never ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _unlink(paths: Iterable[Path]) -> int:
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except (FileNotFoundError, PermissionError):  # gone meanwhile, or another user's
            pass
    return removed


class SegmentSink:
    """A content's encoding arriving in pieces, written where a worker can map it, then decoded.

    The segment is allocated at its final size and each piece is written at its
    offset (``pwrite``: the one copy, straight into the segment's pages). :meth:`decode`
    maps it read-only and decodes it there, so the content's arrays are views of
    the very pages a worker maps in turn, and remembers it in its space; until
    then, :meth:`discard` removes it.
    """

    def __init__(self, space: SegmentSpace, size: int) -> None:
        self._space = space
        self._name = space.new_name()
        self._path = space.root / self._name
        self._size = size
        self._descriptor = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            if space.owner is not None:
                os.fchown(self._descriptor, *space.owner)
            with self._no_room_is_resource_error():
                os.ftruncate(self._descriptor, size)
        except BaseException:
            self.discard()
            raise

    def write(self, offset: int, data: Buffer) -> None:
        """Write ``data`` at ``offset``; the caller keeps it within the announced size."""
        view = memoryview(data).cast("B")
        with self._no_room_is_resource_error():
            while view:
                written = os.pwrite(self._descriptor, view, offset)
                view, offset = view[written:], offset + written

    @contextlib.contextmanager
    def _no_room_is_resource_error(self) -> Iterator[None]:
        """A full memory file system (``/dev/shm`` fills first in containers) says so."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            raise ResourceError(
                f"no room for a payload of {self._size} bytes in {self._space.root} "
                f"({exc.strerror}); give it more space (Docker: --shm-size)"
            ) from exc

    def decode(self, limits: DecodeLimits = DEFAULT_LIMITS) -> RecordDict:
        """The content, decoded in place within ``limits``: its arrays are read-only views
        of the segment."""
        self._close()
        if not self._size:  # nothing to map; let the decoder say what is wrong with nothing
            return unpack_recorddict(b"", limits)
        mapped = map_segment(self._path, take=False)
        content = unpack_recorddict(memoryview(mapped), limits)
        self._space.remember(content, self._name)
        return content

    def discard(self) -> None:
        """Remove the segment; for a payload that will not be decoded."""
        self._close()
        self._path.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1


def _forget(contents: _Contents, key: int, path: Path) -> None:
    """A content was collected: unlink its segment, and forget it unless its id was reused."""
    entry = contents.get(key)
    if entry is not None and entry[1] == path.name:
        contents.pop(key, None)
    path.unlink(missing_ok=True)


_IOV_MAX = 1024
_NO_ROOM = {errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT}


def write_segment(
    path: Path, parts: Parts, *, reuse: bool = False, owner: tuple[int, int] | None = None
) -> None:
    """Write the concatenation of ``parts`` into ``path``, copying each part once.

    A new segment unless ``reuse``, which overwrites an existing one in place — its
    pages are already allocated, which makes writing several times faster than
    into fresh ones. ``writev`` rather than a writable mapping: the kernel copies
    straight into the file's pages instead of taking a page fault for each. ``owner``:
    the (uid, gid) to make a new segment over to (:class:`SegmentSpace`).
    """
    flags = os.O_CREAT | os.O_WRONLY | (0 if reuse else os.O_EXCL)
    descriptor = os.open(path, flags, 0o600)
    try:
        if owner is not None and not reuse:
            os.fchown(descriptor, *owner)
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
