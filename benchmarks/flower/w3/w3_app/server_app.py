"""The ServerApp: FedAvg over sampled nodes, accuracy measured on the server's test set.

The run config travels to the ClientApps in every round's config record; the final
line logged is the last round's server-side accuracy.
"""

import logging

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from w3_app import task

app = ServerApp()
CLIENT_KEYS = ("local-epochs", "batch-size", "learning-rate", "dirichlet-alpha", "seed")


def evaluate_on_server(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    _, _, x_test, y_test = task.dataset()
    loss, accuracy = task.evaluate(arrays.to_numpy_ndarrays(), x_test, y_test)
    return MetricRecord({"accuracy": accuracy, "loss": loss})


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    nodes = int(config["num-nodes"])
    strategy = FedAvg(
        fraction_train=float(config["fraction-train"]),
        fraction_evaluate=float(config["fraction-evaluate"]),
        min_train_nodes=int(nodes * float(config["fraction-train"])),
        min_evaluate_nodes=int(nodes * float(config["fraction-evaluate"])),
        min_available_nodes=nodes,
    )
    client_config = ConfigRecord({key: config[key] for key in CLIENT_KEYS})
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(task.initial_model()),
        num_rounds=int(config["num-server-rounds"]),
        train_config=client_config,
        evaluate_config=client_config,
        evaluate_fn=evaluate_on_server,
    )
    _, _, x_test, y_test = task.dataset()
    _, accuracy = task.evaluate(result.arrays.to_numpy_ndarrays(), x_test, y_test)
    logging.getLogger("flwr").info("final accuracy: %.4f", accuracy)
