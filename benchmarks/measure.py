"""Wall time and peak memory of the whole process tree, sampled from /proc.

A workload's memory is the sum of the resident set sizes of this process and all
its descendants, sampled every ``interval`` seconds by a thread; the peak of those
sums is reported. Where /proc is missing, the peak RSS of this process alone is
reported instead (``ru_maxrss``), and the result says so.

:func:`run_command` does the same for a command started in a session of its own: it
counts every process of that session as well as the command's descendants, so a
daemon that was re-parented when its parent exited (Ray's raylet and workers) is still
counted, and it ends whatever of the session outlives the command, by pid.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
PROC = Path("/proc")


@dataclass
class Measurement:
    seconds: float = 0.0
    peak_bytes: int = 0
    method: str = "process tree, sampled"


@dataclass
class CommandRun(Measurement):
    """A whole command: its figures, its output, and the processes it was made of."""

    method: str = "the command's session and descendants, sampled"
    returncode: int = 0
    output: str = ""
    peak_processes: dict[str, int] = field(default_factory=dict)
    """Process names (``comm``) counted in the peak sample, and how many of each."""
    leftovers: list[str] = field(default_factory=list)
    """Processes of the session still alive when the command had exited (ended here)."""


def _children(pid: int) -> list[int]:
    found = []
    for task in (PROC / str(pid) / "task").glob("*/children"):
        try:
            found.extend(int(child) for child in task.read_text().split())
        except OSError:
            continue
    return found


def _rss(pid: int) -> int:
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, now."""
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += _rss(pid)
        pending.extend(_children(pid))
    return total


@contextmanager
def measure(interval: float = 0.02) -> Iterator[Measurement]:
    """Time the block and sample the process tree's memory while it runs."""
    result = Measurement()
    if not (PROC / "self" / "statm").exists():
        result.method = "this process only (ru_maxrss)"
        started = time.perf_counter()
        yield result
        result.seconds = time.perf_counter() - started
        result.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return
    stop = threading.Event()
    pid = os.getpid()

    def sample() -> None:
        while True:
            result.peak_bytes = max(result.peak_bytes, tree_rss(pid))
            if stop.wait(interval):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        yield result
    finally:
        result.seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
        result.peak_bytes = max(result.peak_bytes, tree_rss(pid))


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(name, parent pid, session id) of a process, or None once it has gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name, _, rest = text[text.index("(") + 1 :].rpartition(")")
    fields = rest.split()
    return name, int(fields[1]), int(fields[3])


def session_processes(session: int, root: int) -> dict[int, str]:
    """Every process of ``session``, and every descendant of ``root``: pid → name."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    found = {pid: name for pid, (name, _, sid) in table.items() if sid == session}
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    pending = [root]
    while pending:
        pid = pending.pop()
        if pid in table:
            found[pid] = table[pid][0]
        pending.extend(children.get(pid, ()))
    return found


def _end(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM these processes, then SIGKILL those still alive after ``grace`` seconds."""
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_stat(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_command(
    argv: list[str], *, cwd: Path, env: Mapping[str, str], interval: float = 0.1
) -> CommandRun:
    """Run ``argv`` in a new session, to its end: wall time, peak summed RSS, output.

    The time is from the start of the process to its exit, as a user waits for it.
    Processes of its session still alive after it exited are listed in ``leftovers``
    and ended (a well-behaved command leaves none).
    """
    result = CommandRun()
    peak_names: Counter[str] = Counter()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout or ()), daemon=True)
    reader.start()
    while True:
        exited = process.poll() is not None
        if exited:
            result.seconds = time.perf_counter() - started
        seen = session_processes(process.pid, process.pid)
        total = sum(_rss(pid) for pid in seen)
        if total > result.peak_bytes:
            result.peak_bytes, peak_names = total, Counter(seen.values())
        if exited:
            break
        time.sleep(interval)
    reader.join()
    result.returncode = process.returncode
    result.output = "".join(output)
    result.peak_processes = dict(sorted(peak_names.items()))
    left = session_processes(process.pid, process.pid)
    left.pop(process.pid, None)
    result.leftovers = [f"{name} ({pid})" for pid, name in sorted(left.items())]
    _end(list(left))
    return result


def timed(function: Callable[[], object]) -> Measurement:
    with measure() as result:
        function()
    return result
