"""Multi-Krum (Blanchard et al., 2017): average the updates that sit closest to the others.

Each valid reply gets a Krum score: the sum of the squared distances from its arrays
to those of its ``n − f − 2`` nearest other replies, where ``f`` is
``num_malicious_nodes``. An update far from the crowd scores badly whatever
direction it is pushed in. The ``num_nodes_to_select`` best-scored replies are
averaged, weighted by their ``weighted_by_key`` metric as in FedAvg, and the
training metrics are the mean over those replies only — both as in Flower 1.42.

The guarantee of the paper needs ``n ≥ 2f + 3`` replies; with fewer, the scores
still use at least one neighbour (as Flower does) and nothing is raised, because
a round short of replies is routine in federated learning. When fewer valid
replies arrive than ``num_nodes_to_select``, all of them are averaged, with a
warning. Scores need every reply at once, so a round holds all of the cohort's models.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fedcore.domain import ArrayRecord, Message, MetricRecord
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import krum_select, weighted_average_arrays
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation

log = logging.getLogger("fedcore.strategy")


class MultiKrum(FedAvg):
    """Federated averaging of the Multi-Krum selection."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        num_malicious_nodes: int = 0,
        num_nodes_to_select: int = 1,
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
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            round_timeout=round_timeout,
            validate_replies=validate_replies,
        )
        self.num_malicious_nodes = arguments.count("num_malicious_nodes", num_malicious_nodes)
        self.num_nodes_to_select = arguments.count(
            "num_nodes_to_select", num_nodes_to_select, minimum=1
        )

    def __repr__(self) -> str:
        return (
            f"{super().__repr__().removesuffix(')')}, "
            f"num_malicious_nodes={self.num_malicious_nodes}, "
            f"num_nodes_to_select={self.num_nodes_to_select})"
        )

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """None: scores compare every reply with every other, in :meth:`aggregate_train`."""
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(server_round, replies)
        if not valid:
            return None, None
        if len(valid) < self.num_nodes_to_select:
            log.warning(
                "round %d train: %d valid replies, fewer than num_nodes_to_select=%d; "
                "averaging them all",
                server_round,
                len(valid),
                self.num_nodes_to_select,
            )
        selected = [
            valid[index]
            for index in krum_select(
                [reply.arrays for reply in valid],
                self.num_malicious_nodes,
                min(self.num_nodes_to_select, len(valid)),
            )
        ]
        weights = [reply.weight for reply in selected]
        metrics = self.train_metrics([reply.records for reply in selected], weights)
        if len(selected) == 1:
            # The mean of one update is that update, whatever its weight: return it as sent.
            arrays = ArrayRecord(selected[0].arrays)
        elif sum(weights) > 0:
            arrays = weighted_average_arrays([reply.arrays for reply in selected], weights)
        else:
            log.warning(
                "round %d train: the selected replies weigh 0 examples; model unchanged",
                server_round,
            )
            return None, metrics
        return self.server_update(server_round, arrays), metrics
