"""The ServerApp: a plain ``def main``, as Flower's advanced-pytorch has it."""

from __future__ import annotations

import numpy as np

from custom_strategy_app.strategy import CustomFedAvg
from fedcore import ArrayRecord, ConfigRecord, Context, Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> object:
    num_rounds = context.run_config["num-server-rounds"]
    strategy = CustomFedAvg(
        fraction_train=context.run_config["fraction-train"],  # type: ignore[arg-type]
        fraction_evaluate=context.run_config["fraction-evaluate"],  # type: ignore[arg-type]
    )
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({"w": np.zeros(3)}),
        train_config=ConfigRecord({"lr": context.run_config["lr"]}),
        num_rounds=num_rounds,  # type: ignore[arg-type]
    )
