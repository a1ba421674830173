"""Krum (Blanchard et al., 2017): the one update that sits closest to the others.

Multi-Krum with ``num_nodes_to_select=1``: the reply with the best Krum score (see
:mod:`fedcore.strategy.multikrum`) becomes the new model as it was sent, and its
metrics are the round's training metrics. The arguments are Flower 1.42's: FedAvg's
plus ``num_malicious_nodes``.
"""

from __future__ import annotations

from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.multikrum import MultiKrum


class Krum(MultiKrum):
    """Krum: the best-scored update."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        num_malicious_nodes: int = 0,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
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
            num_malicious_nodes=num_malicious_nodes,
            num_nodes_to_select=1,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            round_timeout=round_timeout,
            validate_replies=validate_replies,
        )

    def __repr__(self) -> str:
        return (
            f"{FedAvg.__repr__(self).removesuffix(')')}, "
            f"num_malicious_nodes={self.num_malicious_nodes})"
        )
