"""A legacy NumPyClient: each fit adds 1 to the model, evaluate's loss is the model's sum."""

import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context


class AddOne(NumPyClient):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def get_parameters(self, config):
        return [np.zeros(3)]

    def fit(self, parameters, config):
        return [parameters[0] + 1.0], 10 + self.partition, {"partition": self.partition}

    def evaluate(self, parameters, config):
        return float(parameters[0].sum()), 5, {"mean": float(parameters[0].mean())}


def client_fn(context: Context):
    return AddOne(int(context.node_config["partition-id"])).to_client()


app = ClientApp(client_fn=client_fn)
