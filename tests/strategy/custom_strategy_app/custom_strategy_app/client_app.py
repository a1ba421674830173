"""The ClientApp: partition p pulls the model towards (p + 1, p + 1, p + 1) at the lr sent."""

from __future__ import annotations

import numpy as np

from fedcore import ArrayRecord, ClientApp, Context, Message, MetricRecord, RecordDict

app = ClientApp()


def _target(context: Context) -> np.ndarray:
    return np.full(3, float(context.node_config["partition-id"]) + 1.0)  # type: ignore[arg-type]


@app.train()
def train(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"]["w"]
    lr = msg.content["config"]["lr"]
    new = w + lr * (_target(context) - w)  # type: ignore[operator]
    metrics = MetricRecord({"num-examples": 1, "lr": lr})  # type: ignore[dict-item]
    return Message(
        RecordDict({"arrays": ArrayRecord({"w": new}), "metrics": metrics}), reply_to=msg
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"]["w"]
    loss = float(np.mean((w - _target(context)) ** 2))
    metrics = MetricRecord({"num-examples": 1, "loss": loss})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
