"""W2: 1,000 nodes × 5 rounds, a 10-float model, every node trains every round.

The orchestration benchmark: the model is tiny, so the time is fedcore's own — one
message out and one reply back per node per round. The floor does the same
arithmetic (each node's update, then the weighted average) in a plain numpy loop.
"""

from __future__ import annotations

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

NODES, ROUNDS, SIZE = 1_000, 5, 10


def local_update(w: np.ndarray, partition: int) -> tuple[np.ndarray, int]:
    return w + np.float32(0.001) * np.float32(partition % 7), 1 + partition % 5


client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    w, n = local_update(msg.content["arrays"]["w"], context.node_config["partition-id"])
    content = fc.RecordDict(
        {"arrays": fc.ArrayRecord({"w": w}), "metrics": fc.MetricRecord({"num-examples": n})}
    )
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


def floor() -> None:
    """The same arithmetic with no orchestration."""
    w = np.zeros(SIZE, np.float32)
    for _ in range(ROUNDS):
        total = np.zeros(SIZE)
        weight = 0
        for partition in range(NODES):
            update, n = local_update(w, partition)
            total += update * np.float64(n)
            weight += n
        w = (total / weight).astype(np.float32)
