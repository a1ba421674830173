"""The ServerApp: FedAvg or FedAdam over half the nodes a round, a server-side loss.

``FEDCORE_TEST_PAUSE_AT=K`` (the test sets it for the run it kills) stops the run in
round K's server evaluation and writes ``$FEDCORE_TEST_PAUSE_FILE`` for the test to
see, so the SIGKILL lands inside round K however fast or busy the machine is.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAdam, FedAvg

app = fc.ServerApp()

PAUSE_LIMIT = 120.0
"""Seconds a paused run waits to be killed before it fails instead."""


def evaluate_on_server(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
    if str(server_round) == os.environ.get("FEDCORE_TEST_PAUSE_AT"):
        Path(os.environ["FEDCORE_TEST_PAUSE_FILE"]).write_text(str(server_round))
        threading.Event().wait(PAUSE_LIMIT)
        raise RuntimeError("the paused run was not killed")
    w = np.asarray(arrays["w"])
    return fc.MetricRecord({"loss": float(np.mean((w - 2.0) ** 2))})


@app.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    config = context.run_config
    options = {"fraction_train": 0.5, "fraction_evaluate": 0.3, "min_available_nodes": 10}
    strategy = (
        FedAdam(eta=0.05, beta_1=0.9, beta_2=0.99, **options)  # type: ignore[arg-type]
        if config["strategy"] == "fedadam"
        else FedAvg(**options)  # type: ignore[arg-type]
    )
    result = await strategy.start(
        grid=grid,
        initial_arrays=fc.ArrayRecord({"w": np.zeros(4)}),
        num_rounds=int(config["num-server-rounds"]),  # type: ignore[arg-type]
        evaluate_fn=evaluate_on_server,
    )
    return result.arrays
