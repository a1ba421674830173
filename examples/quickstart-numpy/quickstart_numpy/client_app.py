"""The ClientApp: train and evaluate on this node's share of the digits."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import fedcore as fc
from quickstart_numpy import task

client = fc.ClientApp()


@client.lifespan()
def lifespan() -> Iterator[None]:
    """Runs once per worker process, before its first message: load the data there."""
    task.dataset()
    yield


def _data(context: fc.Context) -> tuple[np.ndarray, np.ndarray]:
    return task.local_data(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        context.run_config["dirichlet-alpha"],
        context.run_config["seed"],
    )


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    x, y = _data(context)
    config = msg.content["config"]
    rng = np.random.default_rng(
        [context.run_config["seed"], context.node_config["partition-id"], config["server-round"]]
    )
    model, loss = task.train(
        dict(msg.content["arrays"]),
        x,
        y,
        epochs=context.run_config["local-epochs"],
        batch_size=context.run_config["batch-size"],
        lr=context.run_config["learning-rate"],
        rng=rng,
    )
    metrics = fc.MetricRecord({"num-examples": len(x), "loss": loss})
    return fc.Message(
        fc.RecordDict({"arrays": fc.ArrayRecord(model), "metrics": metrics}), reply_to=msg
    )


@client.evaluate()
def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
    x, y = _data(context)
    loss, accuracy = task.evaluate(dict(msg.content["arrays"]), x, y)
    metrics = fc.MetricRecord({"num-examples": len(x), "loss": loss, "accuracy": accuracy})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
