"""A registry at scale: 100,000 virtual nodes, 3 rounds, 10 nodes sampled per round.

What it measures is the cost of nodes that exist but are not used: registering
them, keeping them, sampling among them. There is no floor: the point is the
absolute figure (seconds and megabytes), start-up included.
"""

from __future__ import annotations

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

NODES, ROUNDS, PER_ROUND = 100_000, 3, 10

client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    w = msg.content["arrays"]["w"] + 1
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(
        fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "metrics": metrics}), reply_to=msg
    )


server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    strategy = FedAvg(fraction_train=PER_ROUND / NODES, fraction_evaluate=0.0)
    initial = fc.ArrayRecord({"w": np.zeros(10, np.float32)})
    result = await strategy.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS)
    return result.arrays


app = fc.App(server=server, client=client)


def run(backend: str) -> None:
    fc.run_simulation(app, nodes=NODES, backend=backend, seed=0)
