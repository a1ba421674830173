"""The ServerApp: FedAvg over sampled nodes, with accuracy measured on the server's test set."""

from __future__ import annotations

import fedcore as fc
from fedcore.strategy import FedAvg
from quickstart_pytorch import task

server = fc.ServerApp()


def evaluate_on_server(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
    model = task.Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    _, _, x_test, y_test = task.dataset()
    loss, accuracy = task.evaluate(model, x_test, y_test)
    return fc.MetricRecord({"accuracy": accuracy, "loss": loss})


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    config = context.run_config
    strategy = FedAvg(
        fraction_train=config["fraction-train"], fraction_evaluate=config["fraction-evaluate"]
    )
    model = task.initial_model(config["seed"])
    result = await strategy.start(
        grid=grid,
        initial_arrays=fc.ArrayRecord(model.state_dict()),
        num_rounds=config["num-server-rounds"],
        evaluate_fn=evaluate_on_server,
    )
    return result.arrays
