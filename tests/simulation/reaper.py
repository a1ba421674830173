"""Run a command as a child subreaper, and report what of its process tree outlived it.

``python reaper.py [--interrupt-on TEXT] -- COMMAND...`` makes this process a child
subreaper (Linux): every process the command starts, however deep, and however it
detaches (a daemon's double fork), becomes this process's child once its parent is
gone. The command runs in a process group of its own; with ``--interrupt-on``, the
first line of its stderr containing TEXT makes this process send SIGINT to that whole
group, as a terminal's Ctrl-C does. Once the command has ended, the processes left
are given :data:`GRACE` seconds to end (they may be on their way out), then counted,
reported and killed. The report, on stdout, is one JSON object: the command's exit
status, its stdout and stderr, and each process left (pid and command line).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

GRACE = 20.0
PR_SET_CHILD_SUBREAPER = 36


def children() -> list[int]:
    """This process's live children (zombies are reaped on the way)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


def wait_for_one_to_end(pids: list[int], timeout: float) -> None:
    """Until one of ``pids`` ends (or another process becomes a child), or ``timeout``."""
    descriptors = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            descriptors.append(os.pidfd_open(pid))
    try:
        if descriptors:
            select.select(descriptors, [], [], max(timeout, 0.0))
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"


def main() -> None:
    arguments = sys.argv[1:]
    interrupt_on = None
    if arguments[0] == "--interrupt-on":
        interrupt_on, arguments = arguments[1], arguments[2:]
    assert arguments[0] == "--"
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "cannot become a child subreaper"
    process = subprocess.Popen(
        arguments[1:],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stderr is not None
    lines: list[str] = []
    out: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        interrupted = False
        for line in process.stderr:
            lines.append(line)
            if interrupt_on is not None and not interrupted and interrupt_on in line:
                interrupted = True
                os.killpg(process.pid, signal.SIGINT)

    readers = [
        threading.Thread(target=read, daemon=True),
        threading.Thread(target=lambda: out.extend(process.stdout or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    status = process.wait(timeout=110)
    for reader in readers:
        reader.join(timeout=10)
    deadline = time.monotonic() + GRACE
    while (left_now := children()) and time.monotonic() < deadline:
        wait_for_one_to_end(left_now, deadline - time.monotonic())
    left = {pid: command_line(pid) for pid in children()}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    report = {"status": status, "stdout": "".join(out), "stderr": "".join(lines), "left": left}
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
