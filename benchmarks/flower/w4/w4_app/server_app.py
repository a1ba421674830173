"""The ServerApp: FedAvg over ``fraction-train`` of the nodes; logs the final accuracy."""

import logging

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from w4_app import task

app = ServerApp()
CLIENT_KEYS = ("local-epochs", "samples", "batch-size", "learning-rate")


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    nodes = int(config["num-nodes"])
    strategy = FedAvg(
        fraction_train=float(config["fraction-train"]),
        fraction_evaluate=0.0,
        min_train_nodes=int(nodes * float(config["fraction-train"])),
        min_available_nodes=nodes,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(task.initial_model(int(config["hidden"]))),
        num_rounds=int(config["num-server-rounds"]),
        train_config=ConfigRecord({key: config[key] for key in CLIENT_KEYS}),
    )
    accuracy = task.accuracy(result.arrays.to_numpy_ndarrays())
    logging.getLogger("flwr").info("final accuracy: %.4f", accuracy)
