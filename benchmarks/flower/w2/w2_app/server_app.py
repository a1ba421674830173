"""The ServerApp: FedAvg over every node, ``num-server-rounds`` rounds; logs the final model."""

import logging

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    nodes = int(config["num-nodes"])
    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=nodes,
        min_available_nodes=nodes,
    )
    initial = ArrayRecord([np.zeros(int(config["model-floats"]), np.float32)])
    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(config["num-server-rounds"])
    )
    (w,) = result.arrays.to_numpy_ndarrays()
    logging.getLogger("flwr").info("final model: %s", np.array2string(w, precision=6))
