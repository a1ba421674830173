"""FedXgbBagging: federated XGBoost by bagging — every node's new trees join the model.

Flower 1.42's strategy of the same name, with FedAvg's constructor arguments. The
global model travels as XGBoost JSON bytes in a one-array ArrayRecord (start with
an empty one, ``ArrayRecord({"0": np.empty(0, np.uint8)})``); each node boosts it a
few rounds on its data and replies with only its new trees; the server appends the
trees of every reply, in send order, to the model it sent
(:func:`fedcore.strategy.xgboost_trees.bag`). Replies are taken as a list; those
whose bytes are not an XGBoost model are logged and left out. Metrics are FedAvg's.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.sampling import Nodes
from fedcore.strategy.xgboost_trees import bag, model_bytes, model_record


class FedXgbBagging(FedAvg):
    """Bagging of XGBoost trees across nodes."""

    replies_keep_layout = False
    """A reply's model bytes have a length of their own: not held to the sent layout."""

    current_bst: bytes | None = None
    """The model bytes the latest :meth:`configure_train` sent (``None`` before it)."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        self.current_bst = model_bytes(arrays)
        return super().configure_train(server_round, arrays, config, node_ids)

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        return None

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self.current_bst is None:
            raise RuntimeError("aggregate_train before configure_train: no model was sent")
        model = self.current_bst
        records: list[RecordDict] = []
        weights: list[float] = []
        for reply in replies:
            if reply.has_error():
                continue
            content = reply.content
            problem = self._problem(content, "train")
            if problem is None:
                try:
                    model = bag(model, model_bytes(next(iter(content.array_records.values()))))
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                self._log_skipped(server_round, "train", reply, problem)
                continue
            records.append(RecordDict({**content.metric_records, **content.config_records}))
            weights.append(self._weight(content))
        if not records:
            return None, None
        self.current_bst = model
        return model_record(model), self.train_metrics(records, weights)
