"""Wall time and peak memory of the whole process tree, sampled from /proc.

A workload's memory is the sum of the resident set sizes of this process and all
its descendants, sampled every ``interval`` seconds by a thread; the peak of those
sums is reported. Where /proc is missing, the peak RSS of this process alone is
reported instead (``ru_maxrss``), and the result says so.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
PROC = Path("/proc")


@dataclass
class Measurement:
    seconds: float = 0.0
    peak_bytes: int = 0
    method: str = "process tree, sampled"


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


def timed(function: Callable[[], object]) -> Measurement:
    with measure() as result:
        function()
    return result
