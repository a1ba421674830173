"""FedMedian (Yin et al., 2018): the coordinate-wise median of the nodes' models.

A median does not move however far its extreme values lie, so fewer than half the
nodes cannot drag a coordinate outside the range of the others' values, whatever
they send. As in Flower 1.42, the arguments are FedAvg's, the median is unweighted,
and the training metrics are FedAvg's weighted mean over every valid reply. The
median needs every reply at once, so a round holds all of the cohort's models.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedcore.domain import ArrayRecord, Message, MetricRecord
from fedcore.strategy.aggregate import coordinate_median
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.protocol import Aggregation


class FedMedian(FedAvg):
    """Federated median."""

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """None: the median is taken over every reply at once, in :meth:`aggregate_train`."""
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(server_round, replies)
        if not valid:
            return None, None
        arrays = coordinate_median([reply.arrays for reply in valid])
        metrics = self.train_metrics(
            [reply.records for reply in valid], [reply.weight for reply in valid]
        )
        return self.server_update(server_round, arrays), metrics
