"""The ClientApp: train and evaluate on this node's share of the digits."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

import fedcore as fc
from quickstart_pytorch import task

client = fc.ClientApp()


@client.lifespan()
def lifespan() -> Iterator[None]:
    """Runs once per worker process, before its first message.

    One thread per worker: the process backend already runs one worker per core, and
    torch's own thread pool on top would only make them fight over the cores.
    """
    torch.set_num_threads(1)
    task.dataset()
    yield


def _data(context: fc.Context) -> tuple[torch.Tensor, torch.Tensor]:
    return task.local_data(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        context.run_config["dirichlet-alpha"],
        context.run_config["seed"],
    )


def _model(msg: fc.Message) -> task.Net:
    model = task.Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    x, y = _data(context)
    model = _model(msg)
    config = msg.content["config"]
    rng = np.random.default_rng(
        [context.run_config["seed"], context.node_config["partition-id"], config["server-round"]]
    )
    loss = task.train(
        model,
        x,
        y,
        epochs=context.run_config["local-epochs"],
        batch_size=context.run_config["batch-size"],
        lr=context.run_config["learning-rate"],
        momentum=context.run_config["momentum"],
        rng=rng,
    )
    metrics = fc.MetricRecord({"num-examples": len(x), "loss": loss})
    arrays = fc.ArrayRecord(model.state_dict())
    return fc.Message(fc.RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@client.evaluate()
def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
    x, y = _data(context)
    loss, accuracy = task.evaluate(_model(msg), x, y)
    metrics = fc.MetricRecord({"num-examples": len(x), "loss": loss, "accuracy": accuracy})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)
