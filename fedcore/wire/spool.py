"""Large payloads held in a temporary file and mapped, rather than in a process's memory.

The link relays models it never computes with: a 200 MB model pushed by a ServerApp
waits at the link until its nodes pull it, and a node's 200 MB reply waits until
the ServerApp pulls it. Held in a ``bytes`` object, every such payload would cost
the link its size in private memory, for as long as it waits. A :class:`Spool`
receives a payload a piece at a time into an unlinked temporary file, and
:meth:`Spool.mapped` maps it read-only: decoding it (``unpack_recorddict`` and its
kin) yields arrays that are views of the mapping, so the payload's pages belong to
the page cache, which the kernel writes back and reclaims as it needs, and the
process's own memory grows by a piece, not a payload. The file has no name from
the start; its space is freed when the last array over the mapping goes.

Small payloads are not worth a file: readers keep those up to
:data:`SPOOL_THRESHOLD` in memory. A temporary directory on a memory file system (``tmpfs``) holds a
spooled payload in memory after all: point ``TMPDIR`` at a disk for a link that
relays large models.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterable

from fedcore.wire.frame import Buffer

SPOOL_THRESHOLD = 1 << 20
"""Payloads up to this size are read into memory; larger ones are spooled."""


class Spool:
    """A payload written piece by piece into an unlinked temporary file; :meth:`mapped` after.

    Use it as a context manager, or call :meth:`close`: a spool that is abandoned
    half-written (the peer went away) gives its file back at once.
    """

    def __init__(self) -> None:
        # The spool owns the file: close() (or leaving the with block) closes it.
        self._file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115
        self.size = 0

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, piece: Buffer) -> None:
        """Append ``piece`` to the payload."""
        view = memoryview(piece).cast("B")
        while view.nbytes:
            written = os.write(self._file.fileno(), view)
            view = view[written:]
            self.size += written

    def write_all(self, pieces: Iterable[Buffer]) -> None:
        """Append each of ``pieces``."""
        for piece in pieces:
            self.write(piece)

    def mapped(self) -> memoryview:
        """The payload written so far, mapped read-only; the spool is closed.

        An empty payload maps to an empty view (``mmap`` cannot map nothing).
        """
        try:
            if self.size == 0:
                return memoryview(b"")
            return memoryview(mmap.mmap(self._file.fileno(), self.size, access=mmap.ACCESS_READ))
        finally:
            self.close()

    def close(self) -> None:
        """Give the file back; a mapping made before stays valid."""
        self._file.close()
