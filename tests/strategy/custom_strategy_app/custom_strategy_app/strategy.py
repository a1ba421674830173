"""CustomFedAvg: FedAvg with a learning-rate schedule and a round loop of its own."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from fedcore import ArrayRecord, ConfigRecord, Grid, Message, MetricRecord
from fedcore.strategy import FedAvg, Result

log = logging.getLogger(__name__)


class CustomFedAvg(FedAvg):
    """Halves the learning rate from round 2; reports each round as one JSON line."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if server_round == 2:
            config["lr"] = config["lr"] * 0.5  # type: ignore[operator]
            log.info("Adjusted learning rate to %f", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)

    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        log.info("Starting %s strategy:", self.__class__.__name__)
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        arrays = initial_arrays
        for current_round in range(1, num_rounds + 1):
            train_replies = grid.send_and_receive(  # type: ignore[attr-defined]
                messages=self.configure_train(current_round, arrays, train_config, grid),
                timeout=timeout,
            )
            agg_arrays, agg_train_metrics = self.aggregate_train(current_round, train_replies)
            if agg_arrays is not None:
                result.arrays = agg_arrays
                arrays = agg_arrays
            if agg_train_metrics is not None:
                result.train_metrics_clientapp[current_round] = agg_train_metrics
            evaluate_replies = grid.send_and_receive(  # type: ignore[attr-defined]
                messages=self.configure_evaluate(current_round, arrays, evaluate_config, grid),
                timeout=timeout,
            )
            agg_evaluate_metrics = self.aggregate_evaluate(current_round, evaluate_replies)
            if agg_evaluate_metrics is not None:
                result.evaluate_metrics_clientapp[current_round] = agg_evaluate_metrics
            report = {
                "round": current_round,
                "w": arrays["w"].tolist(),
                "train": dict(result.train_metrics_clientapp.get(current_round, {})),
                "evaluate": dict(result.evaluate_metrics_clientapp.get(current_round, {})),
            }
            print(json.dumps(report), flush=True)
        return result
