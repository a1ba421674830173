"""The ClientApp: a fixed step of the model and a weight, both from the node's partition."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    partition = int(context.node_config["partition-id"])
    (w,) = msg.content["arrays"].to_numpy_ndarrays()
    w = w + np.float32(0.001) * np.float32(partition % 7)
    metrics = MetricRecord({"num-examples": 1 + partition % 5})
    content = RecordDict({"arrays": ArrayRecord([w]), "metrics": metrics})
    return Message(content=content, reply_to=msg)
