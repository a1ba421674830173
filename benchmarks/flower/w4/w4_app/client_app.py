"""The ClientApp: ``local-epochs`` of SGD on the node's own draw of the digits."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from w4_app import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    partition = int(context.node_config["partition-id"])
    x, y = task.local_data(partition, int(config["samples"]))
    model = task.train(
        msg.content["arrays"].to_numpy_ndarrays(),
        x,
        y,
        epochs=int(config["local-epochs"]),
        batch_size=int(config["batch-size"]),
        lr=float(config["learning-rate"]),
        rng=np.random.default_rng([partition, int(config["server-round"])]),
    )
    metrics = MetricRecord({"num-examples": len(x)})
    return Message(RecordDict({"arrays": ArrayRecord(model), "metrics": metrics}), reply_to=msg)
