"""FedTrimmedAvg (Yin et al., 2018): the coordinate-wise trimmed mean of the nodes' models.

For each coordinate the ``int(beta × n)`` smallest and as many largest of the ``n``
values are dropped and the rest averaged: up to that many nodes per side cannot move
the result outside the others' range, and the mean of what is left keeps more of
the honest information than a median does. As in Flower 1.42, ``beta`` follows
FedAvg's arguments (default 0.2), the trimmed mean is unweighted, and the training
metrics are FedAvg's weighted mean over every valid reply. The trimmed mean needs
every reply at once, so a round holds all of the cohort's models.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedcore.domain import ArrayRecord, Message, MetricRecord
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import trimmed_mean
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation


class FedTrimmedAvg(FedAvg):
    """Federated averaging with a coordinate-wise trimmed mean."""

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
        beta: float = 0.2,
        round_timeout: float | None = None,
        *,
        validate_replies: bool = True,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            round_timeout=round_timeout,
            validate_replies=validate_replies,
        )
        self.beta = arguments.in_range("beta", beta, 0.0, 0.5)

    def __repr__(self) -> str:
        return f"{super().__repr__().removesuffix(')')}, beta={self.beta})"

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """None: the trimmed mean sorts every reply at once, in :meth:`aggregate_train`."""
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(server_round, replies)
        if not valid:
            return None, None
        arrays = trimmed_mean([reply.arrays for reply in valid], self.beta)
        metrics = self.train_metrics(
            [reply.records for reply in valid], [reply.weight for reply in valid]
        )
        return self.server_update(server_round, arrays), metrics
