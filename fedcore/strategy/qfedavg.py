"""q-FedAvg (Li et al., 2020, "Fair Resource Allocation in Federated Learning").

q-FFL reweights the nodes by their training loss raised to ``q``: the larger ``q``,
the more the model is pulled towards the nodes it serves worst, trading some mean
accuracy for a more uniform one; ``q = 0`` is the unweighted mean of the nodes'
models. The server step (:func:`~fedcore.strategy.optimizers.qffl_step`) needs,
from every reply, its arrays and its training loss — the ``train_loss_key`` metric,
a non-negative number — and the arrays that were sent, with ``1 /
client_learning_rate`` standing in for the Lipschitz constant ``L``. Replies are
weighted by loss, not by example count; ``weighted_by_key`` still weights the
training metrics.

Replies are taken as a list (:meth:`QFedAvg.train_aggregation` returns ``None``).
Errors and malformed replies are dropped as FedAvg drops them; a reply without a
usable loss is dropped with a warning too (Flower 1.42 fails the round instead).
Integer and boolean arrays are not stepped: they take the replies' unweighted
mean, rounded (see :mod:`fedcore.strategy.optimizers`; Flower fails on them).

Arguments follow Flower 1.42, ``client_learning_rate`` first and required.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from fedcore.domain import ArrayRecord, Message, MetricRecord
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import weighted_average_arrays
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation, TrainReply
from fedcore.strategy.optimizers import check_layout, optimized, qffl_step
from fedcore.strategy.protocol import Aggregation

log = logging.getLogger("fedcore.strategy")


class QFedAvg(FedAvg):
    """Fair federated averaging: nodes weighted by their training loss to the power ``q``."""

    def __init__(
        self,
        client_learning_rate: float,
        q: float = 0.1,
        train_loss_key: str = "train_loss",
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
        self.client_learning_rate = arguments.positive("client_learning_rate", client_learning_rate)
        self.q = arguments.non_negative("q", q)
        if not isinstance(train_loss_key, str):
            raise TypeError(f"train_loss_key must be a str, got {type(train_loss_key).__name__}")
        self.train_loss_key = train_loss_key

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        used = self._with_losses(server_round, self.valid_train_replies(server_round, replies))
        if not used:
            return None, None
        current = self.current_arrays
        if current is None:
            raise RuntimeError("QFedAvg has no model to step from: call configure_train first")
        # valid_train_replies gave every reply the first one's layout.
        check_layout(current, used[0][0].arrays)
        floats = {key: array for key, array in current.items() if optimized(array)}
        stepped = qffl_step(
            floats,
            ((reply.arrays, loss) for reply, loss in used),
            q=self.q,
            learning_rate=self.client_learning_rate,
        )
        others = [key for key in current if key not in floats]
        if others:
            means = weighted_average_arrays(
                [ArrayRecord({key: reply.arrays[key] for key in others}) for reply, _ in used],
                [1.0] * len(used),
            )
            stepped.update(means)
        arrays = ArrayRecord({key: stepped[key] for key in current})
        metrics = self.train_metrics(
            [reply.records for reply, _ in used], [reply.weight for reply, _ in used]
        )
        return arrays, metrics

    def _with_losses(
        self, server_round: int, valid: list[TrainReply]
    ) -> list[tuple[TrainReply, float]]:
        """The replies with a usable training loss, each with its loss; the rest logged."""
        used = []
        for reply in valid:
            metrics = next(iter(reply.records.metric_records.values()))
            loss = metrics.get(self.train_loss_key)
            if isinstance(loss, int | float) and math.isfinite(loss) and loss >= 0:
                used.append((reply, float(loss)))
                continue
            log.warning(
                "round %d train: reply from node %d not aggregated: metric %r must be a "
                "non-negative number, got %r",
                server_round,
                reply.node_id,
                self.train_loss_key,
                loss,
            )
        return used
