"""The ClientApp: each node pulls the model towards a target of its own, with noise drawn
from (seed, round, node); with ``client-state``, through a velocity kept in
``context.state``, so the model depends on every node's past rounds."""

from __future__ import annotations

import numpy as np

from fedcore import ArrayRecord, ClientApp, Context, Message, MetricRecord, RecordDict

app = ClientApp()


def _target(context: Context) -> np.ndarray:
    partition = int(context.node_config["partition-id"])  # type: ignore[arg-type]
    return np.linspace(0.0, 1.0, 4) * (partition + 1)


@app.train()
def train(msg: Message, context: Context) -> Message:
    w = np.asarray(msg.content["arrays"]["w"])
    server_round = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
    seed = int(context.run_config["seed"])  # type: ignore[arg-type]
    rng = np.random.default_rng([seed, server_round, context.node_id % 2**32])
    step = _target(context) - w + rng.normal(0.0, 0.1, w.shape)
    if context.run_config["client-state"]:
        held = context.state.get("velocity")
        velocity = step if held is None else 0.8 * np.asarray(held["v"]) + step
        context.state["velocity"] = ArrayRecord({"v": velocity})
        step = velocity
    new = w + float(context.run_config["lr"]) * step  # type: ignore[arg-type]
    metrics = MetricRecord({"num-examples": int(rng.integers(1, 10))})
    return Message(
        RecordDict({"arrays": ArrayRecord({"w": new}), "metrics": metrics}), reply_to=msg
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = np.asarray(msg.content["arrays"]["w"])
    loss = float(np.mean((w - _target(context)) ** 2))
    return Message(
        RecordDict({"metrics": MetricRecord({"num-examples": 1, "loss": loss})}), reply_to=msg
    )
