"""W2: 1,000 nodes × 5 rounds, a 10-float model, every node trains every round.

The orchestration benchmark: the model is tiny, so the time is fedcore's own — one
message out and one reply back per node per round. The floors do the same
arithmetic (each node's update, then the weighted average) in a plain numpy loop,
and through a bare process pool.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

import fedcore as fc
from benchmarks.pool import spawn_pool
from fedcore.strategy import FedAvg

NODES, ROUNDS, SIZE = 1_000, 5, 10


def local_update(w: np.ndarray, partition: int) -> tuple[np.ndarray, int]:
    return w + np.float32(0.001) * np.float32(partition % 7), 1 + partition % 5


client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    w, n = local_update(msg.content["arrays"]["w"], context.node_config["partition-id"])
    metrics = fc.MetricRecord({"num-examples": n})
    content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "metrics": metrics})
    return fc.Message(content, reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=NODES)
    initial = fc.ArrayRecord({"w": np.zeros(SIZE, np.float32)})
    result = await strategy.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS)
    return result.arrays


app = fc.App(server=server, client=client)


def run(backend: str) -> None:
    fc.run_simulation(app, nodes=NODES, backend=backend, seed=0)


def _task(task: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    return local_update(*task)


def floor() -> None:
    """The same arithmetic in one process, with no orchestration."""
    w = np.zeros(SIZE, np.float32)
    for _ in range(ROUNDS):
        total, weight = np.zeros(SIZE), 0
        for partition in range(NODES):
            update, n = local_update(w, partition)
            total += update * np.float64(n)
            weight += n
        w = (total / weight).astype(np.float32)


def pool_floor() -> None:
    """The same work through a bare spawn-based process pool."""
    w = np.zeros(SIZE, np.float32)
    with spawn_pool() as pool:
        for _ in range(ROUNDS):
            total, weight = np.zeros(SIZE), 0
            for update, n in pool.imap(_task, ((w, p) for p in range(NODES))):
                total += update * np.float64(n)
                weight += n
            w = (total / weight).astype(np.float32)


def cli() -> None:
    """``fedcore simulate benchmarks.w2:app`` as a user runs it: the whole process, start-up
    and workers included, from the repository root."""
    from fedcore.testing.deployment import FEDCORE  # not in the app's own imports

    subprocess.run(
        [str(FEDCORE), "simulate", "benchmarks.w2:app", "--nodes", str(NODES), "--seed", "0", "-q"],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        check=True,
    )
