"""FedXgbCyclic: federated XGBoost in turns — one node a round boosts the model further.

Flower 1.42's strategy of the same name and arguments. Each round one node gets the
global model (XGBoost JSON bytes in a one-array ArrayRecord), boosts it on its data,
and its reply is the new global model. Nodes take turns in the order they were first
seen — round r goes to the ((r − 1) mod n)-th of the n nodes online — so each node
sees the model every n rounds; evaluation visits them in the same rota.
``fraction_train`` and ``fraction_evaluate`` may only be 1.0 (take part) or 0.0
(skip the phase).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.result import Phase
from fedcore.strategy.sampling import Nodes, candidates

log = logging.getLogger("fedcore.strategy")


class FedXgbCyclic(FedAvg):
    """One node a round, in turns."""

    replies_keep_layout = False
    """A reply's model bytes have a length of their own: not held to the sent layout."""

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        *,
        round_timeout: float | None = None,
        validate_replies: bool = True,
    ) -> None:
        for name, fraction in (
            ("fraction_train", fraction_train),
            ("fraction_evaluate", fraction_evaluate),
        ):
            if fraction not in (0.0, 1.0):
                raise ValueError(f"{name} must be 1.0 or 0.0 for FedXgbCyclic, got {fraction!r}")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            round_timeout=round_timeout,
            validate_replies=validate_replies,
        )
        self.registered_nodes: dict[int, int] = {}
        """Each node's place in the rota: the order in which nodes were first seen."""

    def turn(self, phase: Phase, server_round: int, node_ids: Sequence[int]) -> list[int]:
        """The one node whose turn ``server_round`` is, among ``node_ids``."""
        for node_id in node_ids:
            self.registered_nodes.setdefault(node_id, len(self.registered_nodes))
        rota = sorted(node_ids, key=self.registered_nodes.__getitem__)
        if not rota:
            return []
        chosen = rota[(server_round - 1) % len(rota)]
        log.debug("%s: node %d's turn (%d in the rota)", phase, chosen, len(rota))
        return [chosen]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        if self.fraction_train == 0.0:
            return []
        node_ids = candidates(self, "train", server_round, node_ids)
        return super().configure_train(
            server_round, arrays, config, self.turn("train", server_round, node_ids)
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = candidates(self, "evaluate", server_round, node_ids)
        return super().configure_evaluate(
            server_round, arrays, config, self.turn("evaluate", server_round, node_ids)
        )

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The first usable reply's arrays, as they are, become the global model."""
        for reply in replies:
            if reply.has_error():
                continue
            problem = self._problem(reply.content, "train")
            if problem is not None:
                self._log_skipped(server_round, "train", reply, problem)
                continue
            content = reply.content
            arrays = next(iter(content.array_records.values()))
            records = [RecordDict({**content.metric_records, **content.config_records})]
            return arrays, self.train_metrics(records, [self._weight(content)])
        return None, None
