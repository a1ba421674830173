"""The ServerApp: FedAvg or FedAdam over half the nodes a round (or FedBuff), a server-side loss.

``pause-round = K`` and ``pause-file = PATH`` (the run config of a run a test kills)
stop the run in round K's server evaluation, once: it writes PATH for the test to see
and waits, so the SIGKILL lands inside round K however fast or busy the machine is.
The run that goes on after it finds PATH there and does not stop again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAdam, FedAvg, FedBuff, Strategy

app = fc.ServerApp()

PAUSE_LIMIT = 120.0
"""Seconds a paused run waits to be killed before it fails instead."""


def server_evaluation(config: dict[str, Any]) -> Callable[[int, fc.ArrayRecord], fc.MetricRecord]:
    pause = Path(str(config["pause-file"])) if config["pause-file"] else None

    def evaluate(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
        if pause is not None and server_round == config["pause-round"] and not pause.exists():
            pause.write_text(str(server_round))
            threading.Event().wait(PAUSE_LIMIT)
            raise RuntimeError("the paused run was not killed")
        w = np.asarray(arrays["w"])
        return fc.MetricRecord({"loss": float(np.mean((w - 2.0) ** 2))})

    return evaluate


@app.main()
async def main(grid: fc.Grid, context: fc.Context) -> fc.ArrayRecord:
    config = context.run_config
    options = {
        "fraction_train": 0.5,
        "fraction_evaluate": 0.3,
        "min_available_nodes": config["min-nodes"],
    }
    strategy: Strategy
    if config["strategy"] == "fedadam":
        strategy = FedAdam(eta=0.05, beta_1=0.9, beta_2=0.99, **options)  # type: ignore[arg-type]
    elif config["strategy"] == "fedbuff":
        strategy = FedBuff(buffer_size=3, concurrency=4, min_available_nodes=config["min-nodes"])
    else:
        strategy = FedAvg(**options)  # type: ignore[arg-type]
    result = await strategy.start(
        grid=grid,
        initial_arrays=fc.ArrayRecord({"w": np.zeros(4)}),
        num_rounds=int(config["num-server-rounds"]),  # type: ignore[arg-type]
        evaluate_fn=server_evaluation(config),
    )
    return result.arrays
