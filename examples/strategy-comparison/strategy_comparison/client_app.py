"""The ClientApp: local SGD on this node's share, at this node's (simulated) speed."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import numpy as np

import fedcore as fc
from strategy_comparison import task

client = fc.ClientApp()


@client.lifespan()
def lifespan() -> Iterator[None]:
    task.dataset()
    yield


def _data(context: fc.Context) -> tuple[np.ndarray, np.ndarray]:
    return task.local_data(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        context.run_config["dirichlet-alpha"],
        context.run_config["seed"],
    )


def _delay(context: fc.Context) -> float:
    """Seconds this node's training takes beyond the arithmetic: slow nodes take longer."""
    config = context.run_config
    slow = task.is_slow(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        config["slow-fraction"],
        config["seed"],
    )
    return config["base-delay"] * (config["slow-factor"] if slow else 1.0)


@client.train()
async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
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
        proximal_mu=config.get("proximal-mu", 0.0),
        rng=rng,
    )
    await anyio.sleep(_delay(context))
    metrics = fc.MetricRecord({"num-examples": len(x), "train_loss": loss})
    return fc.Message(
        fc.RecordDict({"arrays": fc.ArrayRecord(model), "metrics": metrics}), reply_to=msg
    )


@client.evaluate()
def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
    x, y = _data(context)
    loss, accuracy = task.evaluate(dict(msg.content["arrays"]), x, y)
    metrics = fc.MetricRecord({"num-examples": len(x), "loss": loss, "accuracy": accuracy})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
