"""One node process per work directory: a lock held for the process's life.

A node's work directory holds its signing key, so two nodes started on one
directory (three terminals in one folder, none with ``--work-dir``) sign as one
node: the link registers them as one node id, each new session ends the one
before, and a run waits on replies that never come. :func:`hold_work_dir` makes
the second one fail at once instead, naming the directory and ``--work-dir``.

The lock is ``flock`` on a file in the directory, on a descriptor that no child
process inherits: the OS drops it when the process ends, however it ends
(SIGKILL too), so a dead node's directory is free again at once, with no stale
lock to clean up. The file keeps the holder's pid, for the message.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedcore.errors import UsageError

LOCK_FILE = "node.lock"
"""The lock's file in a node's work directory."""


@contextmanager
def hold_work_dir(work_dir: Path) -> Iterator[None]:
    """Hold ``work_dir`` (made if missing) for this node while inside, or raise ``UsageError``.

    The error names the directory, the pid of the node holding it and ``--work-dir``.
    """
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        handle = os.open(work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot use the work directory {work_dir}: {exc}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(handle, 32, 0).decode("ascii", errors="replace").strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise UsageError(
                f"the work directory {work_dir.resolve()} is in use by another node{by}: "
                "give each node on this machine its own --work-dir"
            ) from None
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(handle)
