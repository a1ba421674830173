"""The ServerApp: FedAvg over every node; prints one JSON line of what it saw."""

import json
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import logger
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    num_rounds: int = context.run_config["num-server-rounds"]
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord([np.zeros(3)]),
        train_config=ConfigRecord({"lr": 0.1}),
        num_rounds=num_rounds,
    )
    weights = result.arrays.to_numpy_ndarrays()[0]
    logger.log(INFO, "flower-style: final weights %s", weights.tolist())
    report = {"nodes": len(list(grid.get_node_ids())), "weights": weights.tolist()}
    print(json.dumps(report))
