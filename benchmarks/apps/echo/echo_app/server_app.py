"""The ServerApp: ``num-server-rounds`` rounds of send_and_receive to ``num-nodes`` nodes.

Each round sends a float32 model of ``model-floats`` values to every node — one
content shared by the round's messages, as the strategies do, so it is packed once —
and waits for every echo; it logs one line per round, ``round R: S ms, N replies``, which
benchmarks/deployment.py parses. A round is timed with ``time.perf_counter`` (the
run's clock is wall time, which may step): the figure is what a benchmark reports,
not something the app decides with. A missing or wrong echo fails the run, so a
fast round cannot hide lost work. The last line it logs is the process's peak resident
memory, which only the process itself can read once it has ended.
"""

from __future__ import annotations

import logging
import resource
import time

import numpy as np

import fedcore as fc

log = logging.getLogger("echo")

server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    wanted = int(config["num-nodes"])
    online = await grid.wait_for_nodes(wanted, timeout=float(config["node-timeout"]))
    nodes = sorted(online)[:wanted]
    model = np.arange(int(config["model-floats"]), dtype=np.float32)
    arrays = fc.ArrayRecord({"w": model})
    for server_round in range(1, int(config["num-server-rounds"]) + 1):
        started = time.perf_counter()
        content = fc.RecordDict({"arrays": arrays})
        messages = [fc.Message(content, node_id, "train") for node_id in nodes]
        replies = await grid.send_and_receive(messages, timeout=float(config["round-timeout"]))
        seconds = time.perf_counter() - started
        _check(server_round, replies, len(nodes), model)
        log.info("round %d: %.3f ms, %d replies", server_round, seconds * 1000, len(replies))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    log.info("serverapp peak rss: %d KiB", peak)


def _check(server_round: int, replies: list[fc.Message], expected: int, model: np.ndarray) -> None:
    if len(replies) != expected:
        raise RuntimeError(f"round {server_round}: {len(replies)} of {expected} replies came")
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"round {server_round}: a node answered {reply.error}")
        if not np.array_equal(reply.content["arrays"]["w"], model):
            raise RuntimeError(f"round {server_round}: a node sent back a different model")
