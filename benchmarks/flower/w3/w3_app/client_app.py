"""The ClientApp: train and evaluate on this node's share of the digits.

Every hyperparameter comes in the message's config (the ServerApp puts its run config
there), so the ClientApp reads nothing from its own context but the partition.
"""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from w3_app import task

app = ClientApp()


def _data(msg: Message, context: Context) -> tuple[np.ndarray, np.ndarray]:
    config = msg.content["config"]
    return task.local_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        float(config["dirichlet-alpha"]),
        int(config["seed"]),
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    x, y = _data(msg, context)
    config = msg.content["config"]
    partition = int(context.node_config["partition-id"])
    rng = np.random.default_rng([int(config["seed"]), partition, int(config["server-round"])])
    model, loss = task.train(
        msg.content["arrays"].to_numpy_ndarrays(),
        x,
        y,
        epochs=int(config["local-epochs"]),
        batch_size=int(config["batch-size"]),
        lr=float(config["learning-rate"]),
        rng=rng,
    )
    metrics = MetricRecord({"num-examples": len(x), "loss": loss})
    return Message(RecordDict({"arrays": ArrayRecord(model), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    x, y = _data(msg, context)
    loss, accuracy = task.evaluate(msg.content["arrays"].to_numpy_ndarrays(), x, y)
    metrics = MetricRecord({"num-examples": len(x), "loss": loss, "accuracy": accuracy})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
