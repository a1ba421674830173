"""Deployment benchmarks: a real link process on loopback, nodes as processes or as clients.

Cases (``python -m benchmarks.run deploy CASE``):

- ``rounds``: round latency. A link and 4 node processes (:class:`Deployment`), the
  echo app (benchmarks/apps/echo) with a 10-float model for 30 rounds through
  ``fedcore run --stream``. The first round also fetches the bundle and starts each
  node's ClientApp process, so it is reported apart; median and p90 are over the
  others. The link keeps its state in an SQLite file, the production default.
- ``w1-50``: W1's 4 MB float32 model across 50 nodes for 3 rounds. The nodes are 50
  :class:`~fedcore.roles.node.Node` instances, each over its own
  :class:`~fedcore.transport.grpc.GrpcFleetClient` (one connection each), in this
  process's event loop, with an in-process echo runner instead of a ClientApp
  process: the load generator. The link runs with ``--database :memory:``.
  Reported: each round's time, the link's peak RSS, the ServerApp's (it reports its
  own, as only it can once it has ended), and the load generator's memory and CPU.
- ``w1-50-sqlite``: the same against a link on an SQLite file.
- ``heartbeats``: 1,000 nodes registered and heartbeating once a second for 20 s
  (after 2 s of warm-up), as raw ``GrpcFleetClient`` calls from this process, one
  connection per node, spread evenly over each second; each heartbeat's latency as
  this process sees it (p50, p99), the link's RSS and CPU, and this process's CPU —
  it shares the machine's cores with the link, so its own load is part of every
  latency figure. The link keeps its state in an SQLite file. Every call is signed
  with its node's key, as every node's is.
- ``heartbeats-5s``: the same at ``fedcore serve``'s default interval of 5 s.
- ``large``, ``large-memory``: a 200 MB model to 2 node processes and back, and the
  memory of every process on the way (benchmarks/large_messages.py); ``large-400``
  the same with a 400 MB model, to see the relays' memory does not follow its size.

Each row also gives the machine's load average when the case began: the figures
are only comparable between runs on an otherwise idle machine. Everything binds
127.0.0.1 on port 0 and reads its ports from ready files; :class:`Deployment` kills
what it started, by pid, on the way out, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import resource
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import numpy as np

from fedcore.clock import SystemClock
from fedcore.domain import Context, Message, Run
from fedcore.roles.node import Node
from fedcore.runtime.addresses import Address
from fedcore.testing.deployment import Deployment
from fedcore.transport.grpc import GrpcFleetClient

ECHO_APP = Path(__file__).resolve().parent / "apps" / "echo"
ROUND_LINE = re.compile(r"round (\d+): ([0-9.]+) ms, (\d+) replies")
PEAK_LINE = re.compile(r"serverapp peak rss: (\d+) KiB")
RUN_ENDED = re.compile(r"run \d+ finished:.*")
TICKS = os.sysconf("SC_CLK_TCK")

ROUNDS_NODES, ROUNDS_COUNT, ROUNDS_FLOATS = 4, 30, 10
W1_NODES, W1_ROUNDS, W1_FLOATS = 50, 3, 2**20
BEAT_NODES, BEAT_INTERVAL, BEAT_SECONDS, BEAT_WARMUP = 1000, 1.0, 20.0, 2.0
MEMORY = ":memory:"
REGISTER_DEADLINE = 30.0
"""Seconds the load generator's nodes get to register before the case gives up."""
NODE_HEARTBEAT = 5.0
"""Seconds between the load generator's nodes' heartbeats in ``w1-50`` (serve's default)."""


class RunFailed(Exception):
    """The echo run ended other than completed: an outcome to report, not a harness error."""


def case(variant: str) -> dict[str, Any]:
    """Run one deployment case; its figures as a JSON-ready dict.

    A run that the link ends as failed is reported (``failed``: why) rather than
    raised, so that the other cases still run and the table says what broke.
    """
    from benchmarks.large_messages import LARGE_FLOATS, large  # it builds on this module

    cases: dict[str, Callable[[], dict[str, Any]]] = {
        "rounds": rounds,
        "w1-50": partial(w1_50, MEMORY),
        "w1-50-sqlite": partial(w1_50, None),
        "heartbeats": partial(heartbeats, BEAT_INTERVAL),
        "heartbeats-5s": partial(heartbeats, NODE_HEARTBEAT),
        "large": partial(large, None),
        "large-memory": partial(large, MEMORY),
        "large-400": partial(large, None, 2 * LARGE_FLOATS),
    }
    load = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        figures = cases[variant]()
    except RunFailed as exc:
        figures = {"failed": str(exc)}
    return figures | {"seconds": time.perf_counter() - started, "load_average": load}


# Round latency: a link and 4 node processes ------------------------------------------


def rounds() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, Deployment(Path(tmp)) as deployment:
        link = deployment.start_link()
        for index in range(ROUNDS_NODES):
            deployment.start_node(f"partition-id={index} num-partitions={ROUNDS_NODES}")
        output = _run_echo(deployment, ROUNDS_NODES, ROUNDS_COUNT, ROUNDS_FLOATS)
        return {
            "nodes": ROUNDS_NODES,
            "model_floats": ROUNDS_FLOATS,
            **_round_figures(output, ROUNDS_COUNT),
            "link_peak_bytes": _status(link.process.pid)["VmHWM"],
        }


# W1 over 50 nodes: one load-generator process --------------------------------------


class EchoRunner:
    """A ClientApp runner that answers every message with its own content, in this process."""

    async def __aenter__(self) -> EchoRunner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        return Message(message.content, reply_to=message), context


def _echo_runner(run: Run, app_dir: Path, client_ref: str) -> EchoRunner:
    return EchoRunner()


def w1_50(database: str | None) -> dict[str, Any]:
    """W1 over 50 nodes, the link's state in ``database`` (None: an SQLite file)."""
    with tempfile.TemporaryDirectory() as tmp, Deployment(Path(tmp)) as deployment:
        link = deployment.start_link(database=database)
        figures = anyio.run(
            _w1_50, deployment, Path(tmp) / "loadgen", backend_options={"use_uvloop": True}
        )
        return figures | {
            "database": database or "sqlite file",
            "link_peak_bytes": _status(link.process.pid)["VmHWM"],
        }


async def _w1_50(deployment: Deployment, cache: Path) -> dict[str, Any]:
    assert deployment.link is not None
    fleet_address = deployment.link.listeners["fleet"]
    clock = SystemClock()
    async with AsyncExitStack() as stack:
        nodes = []
        for index in range(W1_NODES):
            fleet = await stack.enter_async_context(
                GrpcFleetClient(fleet_address.host, fleet_address.port)
            )
            node = Node(
                fleet,
                node_config={"partition-id": index, "num-partitions": W1_NODES},
                cache_dir=cache / f"node{index}",
                runner_factory=_echo_runner,
                clock=clock,
                heartbeat_interval=NODE_HEARTBEAT,
            )
            nodes.append(await stack.enter_async_context(node))
        with anyio.move_on_after(REGISTER_DEADLINE) as waiting:
            for node in nodes:
                await node.wait_registered()
        if waiting.cancelled_caught:
            link = deployment.link
            raise RuntimeError(
                f"the nodes did not register in {REGISTER_DEADLINE:g} s; the link "
                f"(exit status {link.process.poll()}) said:\n{link.tail()}"
            )
        before = _own_cpu()
        output = await anyio.to_thread.run_sync(
            partial(_run_echo, deployment, W1_NODES, W1_ROUNDS, W1_FLOATS)
        )
        cpu = _own_cpu() - before
    figures = _round_figures(output, W1_ROUNDS)
    return {
        "nodes": W1_NODES,
        "model_floats": W1_FLOATS,
        **figures,
        "serverapp_peak_bytes": _serverapp_peak(output),
        "loadgen_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "loadgen_cpu_seconds": cpu,
    }


# 1,000 heartbeating nodes -------------------------------------------------------------


def heartbeats(interval: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, Deployment(Path(tmp)) as deployment:
        link = deployment.start_link()
        fleet = link.listeners["fleet"]
        figures = anyio.run(
            _heartbeats, fleet, link.process.pid, interval, backend_options={"use_uvloop": True}
        )
        listed = deployment.fedcore("ls", "--nodes", "--json")
        if listed.returncode != 0:
            raise RuntimeError(f"fedcore ls --nodes failed:\n{listed.stderr}")
        online = sum(node["online"] for node in json.loads(listed.stdout))
        return figures | {"online_after": online, **_prefixed("link_", _status(link.process.pid))}


async def _heartbeats(address: Address, link_pid: int, interval: float) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(GrpcFleetClient(address.host, address.port))
            for _ in range(BEAT_NODES)
        ]
        started = time.perf_counter()
        node_ids = [0] * BEAT_NODES

        async def register(index: int) -> None:
            config = {"partition-id": index, "num-partitions": BEAT_NODES}
            node_ids[index] = await clients[index].register_node(config, interval)

        async with anyio.create_task_group() as tasks:
            for index in range(BEAT_NODES):
                tasks.start_soon(register, index)
        registering = time.perf_counter() - started

        latencies: list[float] = []
        missed = 0
        begin = anyio.current_time() + interval
        measure_from = begin + BEAT_WARMUP
        end = measure_from + BEAT_SECONDS

        async def beat(index: int) -> None:
            nonlocal missed
            client, node_id = clients[index], node_ids[index]
            slot = begin + index * interval / BEAT_NODES
            while slot < end:
                await anyio.sleep_until(slot)
                sent = time.perf_counter()
                await client.heartbeat(node_id, interval)
                if slot >= measure_from:
                    latencies.append(time.perf_counter() - sent)
                slot += interval
                while slot < anyio.current_time():  # a beat that overran skips its slots
                    missed += slot >= measure_from
                    slot += interval

        await anyio.sleep_until(begin)
        own, link = _own_cpu(), _cpu(link_pid)
        async with anyio.create_task_group() as tasks:
            for index in range(BEAT_NODES):
                tasks.start_soon(beat, index)
        own, link = _own_cpu() - own, _cpu(link_pid) - link
        beating = anyio.current_time() - begin
    milliseconds = np.array(latencies) * 1000
    return {
        "nodes": BEAT_NODES,
        "connections": BEAT_NODES,
        "interval": interval,
        "window_seconds": BEAT_SECONDS,
        "register_seconds": registering,
        "beats": len(latencies),
        "missed_slots": missed,
        "p50_ms": float(np.percentile(milliseconds, 50)),
        "p99_ms": float(np.percentile(milliseconds, 99)),
        "max_ms": float(milliseconds.max()),
        "loadgen_cpu_percent": 100 * own / beating,
        "link_cpu_percent": 100 * link / beating,
        "loadgen_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


# What the cases share -----------------------------------------------------------------


def _run_echo(deployment: Deployment, nodes: int, count: int, floats: int) -> str:
    """Run the echo app with ``fedcore run --stream``; its output, once it completed."""
    config = f"num-nodes={nodes} num-server-rounds={count} model-floats={floats}"
    done = deployment.fedcore("run", str(ECHO_APP), "--stream", "--run-config", config)
    if done.returncode != 0:
        ended = RUN_ENDED.search(done.stderr)
        if ended is None:
            raise RuntimeError(f"fedcore run failed ({done.returncode}):\n{done.stderr}")
        raise RunFailed(ended[0])
    return done.stdout


def _round_figures(output: str, count: int) -> dict[str, Any]:
    """Round times from the ServerApp's lines: all of them, the first, and the rest's spread."""
    times = [float(ms) for _, ms, _ in ROUND_LINE.findall(output)]
    if len(times) != count:
        raise RuntimeError(f"expected {count} round lines, found {len(times)}:\n{output}")
    warm = np.array(times[1:])
    return {
        "rounds": count,
        "round_ms": times,
        "first_round_ms": times[0],
        "median_ms": float(np.median(warm)),
        "p90_ms": float(np.percentile(warm, 90)),
    }


def _serverapp_peak(output: str) -> int:
    found = PEAK_LINE.search(output)
    if found is None:
        raise RuntimeError(f"the ServerApp did not report its peak RSS:\n{output}")
    return int(found[1]) * 1024


def _status(pid: int) -> dict[str, int]:
    """The ``Vm*`` and ``Rss*`` fields of ``/proc/<pid>/status``, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name.startswith(("Rss", "Vm")):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def _prefixed(prefix: str, figures: dict[str, int]) -> dict[str, int]:
    """VmHWM (peak) and VmRSS (now) of ``figures``, named as the rows report them."""
    names = {"VmHWM": "peak_bytes", "VmRSS": "rss_bytes"}
    return {prefix + label: figures[name] for name, label in names.items()}


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
