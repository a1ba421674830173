"""Keeping a process's memory from other processes of its user (Linux: not dumpable).

Linux lets a process read another's memory (``/proc/PID/mem``, ``ptrace``), and its
initial environment (``/proc/PID/environ``), when both run as the same user and the
target is *dumpable* — which every process is, unless it says otherwise. So a
ServerApp could read another run's launch secret out of that run's ServerApp, and
an app process running as its role's user could read the role's memory. A process
that clears the flag (``prctl(PR_SET_DUMPABLE, 0)``) can be read that way only by a
process holding ``CAP_SYS_PTRACE`` (root); its ``/proc/PID`` files become root's,
and it leaves no core dump. The flag is reset by ``execve``, so each process clears
it itself: every ``fedcore serve`` role at start, and each app process it launches
before it reads its secret or imports the app.

A side effect for the process itself: not being root, it can no longer open its own
``/proc/self/environ`` or ``/proc/self/mem`` (``/proc/self/status`` and the like stay
readable).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def make_non_dumpable() -> bool:
    """Clear this process's dumpable flag; False where the system has none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    if _prctl(PR_SET_DUMPABLE, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True


def is_dumpable() -> bool:
    """Whether other processes of this user may read this one's memory (always, off Linux)."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(_prctl(PR_GET_DUMPABLE, 0))


def _prctl(option: int, argument: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    result: int = libc.prctl(option, argument, 0, 0, 0)
    return result
