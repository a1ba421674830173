"""FedAvg (McMahan et al., 2017): the example-weighted mean of the nodes' models.

Constructor arguments and behaviour follow Flower 1.42's ``FedAvg``: each round
samples ``max(int(n × fraction_train), min_train_nodes)`` of the ``n`` online nodes,
sends them the arrays and config under ``arrayrecord_key`` / ``configrecord_key``
(with ``server-round`` added to the config), and averages the returned arrays
weighted by the ``weighted_by_key`` metric of each reply. A reply that is an
error, or lacks the arrays or the weight, is a failure: logged, never averaged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy.aggregate import (
    check_same_layout,
    weighted_average_arrays,
    weighted_average_metrics,
)
from fedcore.strategy.base import Strategy
from fedcore.strategy.result import Phase

log = logging.getLogger("fedcore.strategy")

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def _fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1, got {value!r}")
    return float(value)


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


class FedAvg(Strategy):
    """Federated averaging."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
    ) -> None:
        self.fraction_train = _fraction("fraction_train", fraction_train)
        self.fraction_evaluate = _fraction("fraction_evaluate", fraction_evaluate)
        self.min_train_nodes = _count("min_train_nodes", min_train_nodes)
        self.min_evaluate_nodes = _count("min_evaluate_nodes", min_evaluate_nodes)
        self.min_available_nodes = _count("min_available_nodes", min_available_nodes)
        self.weighted_by_key = weighted_by_key
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.train_metrics_aggr_fn = train_metrics_aggr_fn or self._average_metrics
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn or self._average_metrics

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(fraction_train={self.fraction_train}, "
            f"fraction_evaluate={self.fraction_evaluate}, "
            f"min_available_nodes={self.min_available_nodes})"
        )

    def min_nodes(self, phase: Phase) -> int:
        fraction, minimum = self._sampling(phase)
        return 0 if fraction == 0.0 else max(self.min_available_nodes, minimum, 1)

    def _sampling(self, phase: Phase) -> tuple[float, int]:
        if phase == "train":
            return self.fraction_train, self.min_train_nodes
        return self.fraction_evaluate, self.min_evaluate_nodes

    def _sample(self, phase: Phase, node_ids: Sequence[int]) -> Sequence[int]:
        fraction, minimum = self._sampling(phase)
        if fraction == 0.0:
            return []
        size = min(max(int(len(node_ids) * fraction), minimum), len(node_ids))
        log.debug("%s: sampled %d of %d nodes", phase, size, len(node_ids))
        return node_ids[:size]

    def _messages(
        self,
        phase: Phase,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        node_ids: Sequence[int],
    ) -> list[Message]:
        config = ConfigRecord(config)
        config["server-round"] = server_round
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [
            Message(content, node_id, phase, group_id=str(server_round))
            for node_id in self._sample(phase, node_ids)
        ]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        return self._messages("train", server_round, arrays, config, node_ids)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        return self._messages("evaluate", server_round, arrays, config, node_ids)

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self._valid_replies(server_round, "train", replies)
        if not valid:
            return None, None
        contents = [reply.content for reply in valid]
        weights = [self._weight(content) for content in contents]
        if sum(weights) <= 0:
            log.warning(
                "round %d train: all replies weigh 0 examples; model unchanged", server_round
            )
            return None, self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        arrays = weighted_average_arrays(
            [next(iter(content.array_records.values())) for content in contents], weights
        )
        return arrays, self.train_metrics_aggr_fn(contents, self.weighted_by_key)

    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        valid = self._valid_replies(server_round, "evaluate", replies)
        if not valid:
            return None
        return self.evaluate_metrics_aggr_fn(
            [reply.content for reply in valid], self.weighted_by_key
        )

    def _weight(self, content: RecordDict) -> float:
        metrics = next(iter(content.metric_records.values()))
        return float(metrics[self.weighted_by_key])  # type: ignore[arg-type]

    def _average_metrics(self, contents: list[RecordDict], weighted_by_key: str) -> MetricRecord:
        records = [next(iter(content.metric_records.values())) for content in contents]
        weights = [self._weight(content) for content in contents]
        if sum(weights) <= 0:
            weights = [1.0] * len(records)
        return weighted_average_metrics(records, weights, exclude=weighted_by_key)

    def _valid_replies(
        self, server_round: int, phase: Phase, replies: Sequence[Message]
    ) -> list[Message]:
        """Replies fit to aggregate; the others are logged (errors are logged by the driver)."""
        valid: list[Message] = []
        template: ArrayRecord | None = None
        for reply in replies:
            if reply.has_error():
                continue
            problem = self._problem(reply.content, phase)
            if problem is None and phase == "train":
                arrays = next(iter(reply.content.array_records.values()))
                if template is None:
                    template = arrays
                try:
                    check_same_layout(template, arrays)
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                log.warning(
                    "round %d %s: reply from node %d not aggregated: %s",
                    server_round,
                    phase,
                    reply.metadata.src_node_id,
                    problem,
                )
                continue
            valid.append(reply)
        return valid

    def _problem(self, content: RecordDict, phase: Phase) -> str | None:
        metrics = content.metric_records
        if len(metrics) != 1:
            return f"expected one MetricRecord, found {len(metrics)}"
        value = next(iter(metrics.values())).get(self.weighted_by_key)
        if isinstance(value, list) or value is None or value < 0:
            return f"metric {self.weighted_by_key!r} must be a non-negative number, got {value!r}"
        if phase == "train" and len(content.array_records) != 1:
            return f"expected one ArrayRecord, found {len(content.array_records)}"
        return None
