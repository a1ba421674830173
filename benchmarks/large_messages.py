"""Deployment case ``large`` (and ``large-memory``): a 200 MB model to 2 nodes and back.

A link (on an SQLite file; ``large-memory``: ``--database :memory:``) and 2 node
processes (heartbeating every 5 s, serve's default) run the echo app
(benchmarks/apps/echo) with a float32 model of :data:`LARGE_FLOATS` values, 200 MB,
for :data:`LARGE_ROUNDS` rounds: every round the model goes ServerApp → link → each
node → its ClientApp process, and back.

The promise measured (issue 5, item 7): the processes that relay a model — the
link, and each node in front of its ClientApp — hold a chunk of it per transfer,
never the whole of it. A thread samples ``/proc/<pid>/status`` of every process of
the federation every :data:`SAMPLE_SECONDS` and keeps, per role, the peak of:

- ``RssAnon``: private memory. For the link and the nodes, the figure the promise
  is about: reported as the growth over the process's figure before the run.
- ``RssShmem``: shared memory mapped (``/dev/shm`` segments): where a node hands a
  model to its ClientApp process, and where that process answers.
- ``RssFile``: file pages mapped — a spooled model the process reads, which the
  kernel may drop from memory at any time (it is on disk).

The ServerApp and the ClientApp processes are the model's ends, not relays: they
hold it because the app does. Their peaks are reported for completeness.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.deployment import (
    NODE_HEARTBEAT,
    _round_figures,
    _run_echo,
    _serverapp_peak,
    _status,
)
from fedcore.testing.deployment import Deployment

LARGE_NODES, LARGE_ROUNDS, LARGE_FLOATS = 2, 3, 50_000_000
SAMPLE_SECONDS = 0.02
FIELDS = ("RssAnon", "RssShmem", "RssFile")


def large(database: str | None, floats: int = LARGE_FLOATS) -> dict[str, Any]:
    """The echo of a model of ``floats`` float32s, the link's state in ``database``.

    ``database`` None is an SQLite file.
    """
    with (
        tempfile.TemporaryDirectory() as tmp,
        Deployment(Path(tmp), heartbeat_interval=NODE_HEARTBEAT) as deployment,
    ):
        link = deployment.start_link(database=database)
        nodes = [
            deployment.start_node(f"partition-id={index} num-partitions={LARGE_NODES}")
            for index in range(LARGE_NODES)
        ]
        node_pids = [node.process.pid for node in nodes]
        roles: dict[str, Callable[[], list[int]]] = {
            "link": lambda: [link.process.pid],
            "node": lambda: node_pids,
            "clientapp": lambda: [child for pid in node_pids for child in _children(pid)],
            "serverapp": deployment.app_pids,
        }
        before = {pid: _status(pid)["RssAnon"] for pid in [link.process.pid, *node_pids]}
        with _sampled(roles) as peaks:
            output = _run_echo(deployment, LARGE_NODES, LARGE_ROUNDS, floats)
        return {
            "nodes": LARGE_NODES,
            "model_floats": floats,
            "database": database or "sqlite file",
            **_round_figures(output, LARGE_ROUNDS),
            "link_peak_bytes": _status(link.process.pid)["VmHWM"],
            "serverapp_peak_bytes": _serverapp_peak(output),
            "link_private_growth_bytes": peaks["link"]["RssAnon"] - before[link.process.pid],
            "node_private_growth_bytes": max(
                peaks[f"pid {pid}"]["RssAnon"] - before[pid] for pid in node_pids
            ),
            "peaks": {role: peak for role, peak in peaks.items() if not role.startswith("pid")},
        }


@contextmanager
def _sampled(roles: dict[str, Callable[[], list[int]]]) -> Iterator[dict[str, dict[str, int]]]:
    """Peaks of :data:`FIELDS` per role (the largest process of it) and per pid, sampled."""
    peaks: dict[str, dict[str, int]] = {}
    stop = threading.Event()

    def note(key: str, status: dict[str, int]) -> None:
        peak = peaks.setdefault(key, dict.fromkeys(FIELDS, 0))
        for field in FIELDS:
            peak[field] = max(peak[field], status.get(field, 0))

    def sample() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            for role, pids in roles.items():
                for pid in pids():
                    try:
                        status = _status(pid)
                    except OSError:  # it ended between listing and reading
                        continue
                    note(role, status)
                    note(f"pid {pid}", status)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.extend(int(child) for child in task.read_text().split())
        except OSError:
            continue
    return found
