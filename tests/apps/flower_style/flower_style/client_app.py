"""The ClientApp: adds the run's ``step`` to every array; reports its partition."""

import flwr
import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app: flwr.clientapp.ClientApp = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    step = context.run_config["step"]
    updated = ArrayRecord([array + np.float64(step) for array in arrays])
    metrics = MetricRecord({"num-examples": 1, "partition": context.node_config["partition-id"]})
    return Message(content=RecordDict({"arrays": updated, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"num-examples": 1, "loss": 0.25})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
