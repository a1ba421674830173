"""W1: 500 nodes × 3 rounds, a 4 MB float32 model, every node every round, the ClientApp
returning the arrays unchanged.

The data-movement benchmark: each round sends the model to 500 nodes and takes
500 models back. The floors: the same folding in one process, and the same work
through a bare process pool (which pickles the model through its pipes).
"""

from __future__ import annotations

import numpy as np

import fedcore as fc
from benchmarks.pool import spawn_pool
from fedcore.strategy import FedAvg

NODES, ROUNDS, FLOATS = 500, 3, 2**20

client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    metrics = fc.MetricRecord({"num-examples": 1})
    content = fc.RecordDict({"arrays": msg.content["arrays"], "metrics": metrics})
    return fc.Message(content, reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=NODES)
    initial = fc.ArrayRecord({"w": np.ones(FLOATS, np.float32)})
    result = await strategy.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS)
    return result.arrays


app = fc.App(server=server, client=client)


def run(backend: str) -> None:
    fc.run_simulation(app, nodes=NODES, backend=backend, seed=0)


def _echo(w: np.ndarray) -> np.ndarray:
    return w


def floor() -> None:
    """The same folding in one process: each node's model into a float64 running sum."""
    w = np.ones(FLOATS, np.float32)
    for _ in range(ROUNDS):
        total = np.zeros(FLOATS)
        for _ in range(NODES):
            total += _echo(w) * np.float64(1)
        w = (total / NODES).astype(np.float32)


def pool_floor() -> None:
    """The same work through a bare spawn-based process pool."""
    w = np.ones(FLOATS, np.float32)
    with spawn_pool() as pool:
        for _ in range(ROUNDS):
            total = np.zeros(FLOATS)
            for update in pool.imap(_echo, (w for _ in range(NODES))):
                total += update * np.float64(1)
            w = (total / NODES).astype(np.float32)
