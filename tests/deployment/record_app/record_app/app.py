"""FedAvg over every node, each round adding one to every weight: a record known in advance.

Each ClientApp adds 1 to the arrays it gets, after ``train-seconds``, and reports a
training ``loss`` of 1/round; evaluating, it reports the mean weight as ``mean``. The
server evaluates the model after every round as well (``server.mean``, or whatever
``metric-name`` says), so round k's line says k whichever scope is read. ``main``
prints the final model as one JSON line (``{"model": {name: values}}``) for a test to
compare with ``model.npz``, and returns the strategy's ``Result`` (or, with
``fail-at-end``, raises).
"""

from __future__ import annotations

import json
import time

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

client = fc.ClientApp()
server = fc.ServerApp()


def _mean(arrays: fc.ArrayRecord) -> float:
    return float(np.mean(arrays.to_numpy_ndarrays()[0]))


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    time.sleep(context.run_config["train-seconds"])
    arrays = msg.content["arrays"]
    plus_one = fc.ArrayRecord(
        {
            name: value + 1
            for name, value in zip(arrays.keys(), arrays.to_numpy_ndarrays(), strict=True)
        }
    )
    server_round = msg.content["config"]["server-round"]
    metrics = fc.MetricRecord({"num-examples": 1, "loss": 1.0 / server_round})
    return fc.Message(fc.RecordDict({"arrays": plus_one, "metrics": metrics}), reply_to=msg)


@client.evaluate()
def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
    metrics = fc.MetricRecord({"num-examples": 1, "mean": _mean(msg.content["arrays"])})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> object:
    config = context.run_config
    nodes = config["min-nodes"]
    strategy = FedAvg(min_train_nodes=nodes, min_evaluate_nodes=nodes, min_available_nodes=nodes)
    initial = fc.ArrayRecord(
        {"w": np.zeros((2, 3), dtype=np.float32), "b": np.arange(4, dtype=np.float64)}
    )

    def on_server(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
        return fc.MetricRecord({config["metric-name"]: _mean(arrays)})

    result = await strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=config["rounds"], evaluate_fn=on_server
    )
    model = dict(zip(result.arrays.keys(), result.arrays.to_numpy_ndarrays(), strict=True))
    print(json.dumps({"model": {name: value.tolist() for name, value in model.items()}}))
    if config["fail-at-end"]:
        raise RuntimeError("main was told to fail at its end")
    return result
