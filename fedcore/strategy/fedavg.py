"""FedAvg (McMahan et al., 2017): the example-weighted mean of the nodes' models.

Constructor arguments and behaviour follow Flower 1.42's ``FedAvg``: each round
samples ``max(int(n × fraction_train), min_train_nodes)`` of the ``n`` online nodes,
sends them the arrays and config under ``arrayrecord_key`` / ``configrecord_key``
(with ``server-round`` added to the config), and averages the returned arrays
weighted by the ``weighted_by_key`` metric of each reply. A reply that is an
error, or lacks the arrays or the weight, is a failure: logged, never averaged.
Before that the round driver checks each training reply against the message it
answers (:meth:`FedAvg.check_train_reply`, :mod:`fedcore.strategy.replies`): arrays
laid out as sent, finite, a weight from 0 to 2^53; a refused reply is a failure
counted in the round's summary. ``validate_replies=False`` skips the check, as
Flower has none.
Training replies are folded into running means as they arrive
(:meth:`FedAvg.train_aggregation`), so a round never holds more than one model.
A custom ``train_metrics_aggr_fn`` receives each reply's metric and config records.

FedAvg is also the base of the strategies that change only one step of it:

- how the training config is built — override :meth:`configure_train` (FedProx);
  its last argument is node ids from fedcore's driver or a Grid from Flower-style
  code, and ``super().configure_train`` takes either;
- what the server does with the mean — override :meth:`server_update`, which gets
  the round's mean and may read :attr:`current_arrays`, the arrays sent for
  training (FedAvgM, FedAdam, FedYogi, FedAdagrad);
- how the replies are combined — return ``None`` from :meth:`train_aggregation`
  and override :meth:`aggregate_train`, using :meth:`valid_train_replies` and
  :meth:`train_metrics` for the bookkeeping (FedMedian, Krum, Bulyan, …).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypedDict

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.errors import InconsistentRepliesError, RefusedReplyError
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import ArrayMean, check_same_layout, metric_mean, reply_weight
from fedcore.strategy.base import Strategy
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.replies import check_train_reply
from fedcore.strategy.result import Phase
from fedcore.strategy.sampling import Nodes, candidates

log = logging.getLogger("fedcore.strategy")

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


class FedAvgOptions(TypedDict, total=False):
    """FedAvg's constructor arguments, for the variants that take them by keyword only
    (``**options: Unpack[FedAvgOptions]``) instead of repeating each one."""

    fraction_train: float
    fraction_evaluate: float
    min_train_nodes: int
    min_evaluate_nodes: int
    min_available_nodes: int
    weighted_by_key: str
    arrayrecord_key: str
    configrecord_key: str
    train_metrics_aggr_fn: MetricsAggregation | None
    evaluate_metrics_aggr_fn: MetricsAggregation | None
    round_timeout: float | None
    validate_replies: bool


@dataclass(frozen=True)
class TrainReply:
    """One usable training reply: its arrays, its weight and its small records."""

    node_id: int
    arrays: ArrayRecord
    weight: float
    records: RecordDict
    """The reply's metric and config records (what ``train_metrics_aggr_fn`` receives)."""


class FedAvg(Strategy):
    """Federated averaging."""

    current_arrays: ArrayRecord | None
    """The arrays the latest :meth:`configure_train` sent (``None`` before the first)."""

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
        *,
        round_timeout: float | None = None,
        validate_replies: bool = True,
    ) -> None:
        self.round_timeout = (
            None if round_timeout is None else arguments.positive("round_timeout", round_timeout)
        )
        self.validate_replies = arguments.flag("validate_replies", validate_replies)
        self.fraction_train = arguments.fraction("fraction_train", fraction_train)
        self.fraction_evaluate = arguments.fraction("fraction_evaluate", fraction_evaluate)
        self.min_train_nodes = arguments.count("min_train_nodes", min_train_nodes)
        self.min_evaluate_nodes = arguments.count("min_evaluate_nodes", min_evaluate_nodes)
        self.min_available_nodes = arguments.count("min_available_nodes", min_available_nodes)
        self.weighted_by_key = weighted_by_key
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.train_metrics_aggr_fn = train_metrics_aggr_fn
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn
        self.current_arrays = None

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
        node_ids: Nodes,
    ) -> list[Message]:
        node_ids = candidates(self, phase, server_round, node_ids)
        config = ConfigRecord(config)
        config["server-round"] = server_round
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [
            Message(content, node_id, phase, group_id=str(server_round))
            for node_id in self._sample(phase, node_ids)
        ]

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        self.current_arrays = arrays
        return self._messages("train", server_round, arrays, config, node_ids)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        return self._messages("evaluate", server_round, arrays, config, node_ids)

    replies_keep_layout: ClassVar[bool] = True
    """Whether a training reply returns the arrays it was sent, changed in value only
    (checked by :meth:`check_train_reply`): true of every strategy that averages
    models; FedXgb's replies are trees of their own length."""

    def check_train_reply(self, sent: Message, reply: Message) -> Message:
        """As :meth:`Strategy.check_train_reply`, and the reply must be one FedAvg can
        weigh — its ``weighted_by_key`` a count from 0 to 2^53 — and read: one
        ArrayRecord, one MetricRecord (refused as ``malformed``)."""
        if not self.validate_replies:
            return reply
        content = check_train_reply(
            sent.content,
            reply.content,
            weighted_by_key=self.weighted_by_key,
            same_layout=self.replies_keep_layout,
        )
        problem = self._problem(content, "train")
        if problem is not None:
            raise RefusedReplyError("malformed", problem)
        return reply if content is reply.content else reply.with_content(content)

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        return _Averaging(self, server_round)

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        aggregation = _Averaging(self, server_round)
        for reply in replies:
            aggregation.add(reply)
        return aggregation.result()

    def server_update(self, server_round: int, aggregated: ArrayRecord) -> ArrayRecord:
        """The new global arrays given the round's aggregate (FedAvg: the aggregate itself)."""
        return aggregated

    def valid_train_replies(
        self, server_round: int, replies: Sequence[Message]
    ) -> list[TrainReply]:
        """The replies fit to aggregate, in order: errors dropped silently (the round
        driver counts them), malformed ones and ones whose arrays differ in layout
        from the first valid reply dropped with a warning."""
        valid: list[TrainReply] = []
        for reply in replies:
            if reply.has_error():
                continue
            content = reply.content
            problem = self._problem(content, "train")
            if problem is None:
                arrays = next(iter(content.array_records.values()))
                try:
                    if valid:
                        check_same_layout(valid[0].arrays, arrays)
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                self._log_skipped(server_round, "train", reply, problem)
                continue
            valid.append(
                TrainReply(
                    reply.metadata.src_node_id,
                    arrays,
                    self._weight(content),
                    RecordDict({**content.metric_records, **content.config_records}),
                )
            )
        return valid

    def train_metrics(
        self, records: Sequence[RecordDict], weights: Sequence[float]
    ) -> MetricRecord | None:
        """The round's training metrics from the valid replies' small records and
        weights: ``train_metrics_aggr_fn``, else the weighted mean."""
        if not records:
            return None
        if self.train_metrics_aggr_fn is not None:
            return self.train_metrics_aggr_fn(list(records), self.weighted_by_key)
        return metric_mean(list(records), list(weights), self.weighted_by_key)

    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        valid = []
        for reply in replies:
            if reply.has_error():
                continue
            problem = self._problem(reply.content, "evaluate")
            if problem is not None:
                self._log_skipped(server_round, "evaluate", reply, problem)
                continue
            valid.append(reply.content)
        if not valid:
            return None
        if self.evaluate_metrics_aggr_fn is not None:
            return self.evaluate_metrics_aggr_fn(valid, self.weighted_by_key)
        return metric_mean(
            valid, [self._weight(content) for content in valid], self.weighted_by_key
        )

    def _weight(self, content: RecordDict) -> float:
        return reply_weight(content, self.weighted_by_key)

    def _log_skipped(self, server_round: int, phase: Phase, reply: Message, problem: str) -> None:
        log.warning(
            "round %d %s: reply from node %d not aggregated: %s",
            server_round,
            phase,
            reply.metadata.src_node_id,
            problem,
        )

    def _problem(self, content: RecordDict, phase: Phase) -> str | None:
        return reply_problem(content, self.weighted_by_key, arrays=phase == "train")


def reply_problem(content: RecordDict, weighted_by_key: str, *, arrays: bool) -> str | None:
    """Why a reply's content cannot be aggregated (``None``: it can): it must hold one
    MetricRecord whose ``weighted_by_key`` is a non-negative number and, when ``arrays``,
    one ArrayRecord."""
    metrics = content.metric_records
    if len(metrics) != 1:
        return f"expected one MetricRecord, found {len(metrics)}"
    value = next(iter(metrics.values())).get(weighted_by_key)
    if isinstance(value, list) or value is None or value < 0:
        return f"metric {weighted_by_key!r} must be a non-negative number, got {value!r}"
    if arrays and len(content.array_records) != 1:
        return f"expected one ArrayRecord, found {len(content.array_records)}"
    return None


def validate_message_reply_consistency(
    replies: Sequence[RecordDict], weighted_by_key: str, check_arrayrecord: bool
) -> None:
    """Raise :class:`~fedcore.errors.InconsistentRepliesError` unless every reply can be
    aggregated (:func:`reply_problem`) and they agree: their MetricRecords, and when
    ``check_arrayrecord`` their ArrayRecords, have the same name and the same keys.

    Flower's ``strategy_utils`` name, for a strategy that checks a round's replies all
    at once; FedAvg checks each reply as it comes and leaves out the ones that fail.
    """
    for index, content in enumerate(replies):
        problem = reply_problem(content, weighted_by_key, arrays=check_arrayrecord)
        if problem is not None:
            raise InconsistentRepliesError(f"reply {index}: {problem}")
    kinds = ["metric", "array"] if check_arrayrecord else ["metric"]
    for kind in kinds:
        layouts = [_record_layout(content, kind) for content in replies]
        for index, (name, keys) in enumerate(layouts[1:], start=1):
            if (name, keys) != layouts[0]:
                first_name, first_keys = layouts[0]
                raise InconsistentRepliesError(
                    f"reply {index} has the {kind} record {name!r} of {sorted(keys)}, "
                    f"reply 0 {first_name!r} of {sorted(first_keys)}"
                )


def _record_layout(content: RecordDict, kind: str) -> tuple[str, set[str]]:
    """The name of the one record of ``kind`` in ``content``, and its keys."""
    if kind == "metric":
        name, metrics = next(iter(content.metric_records.items()))
        return name, set(metrics)
    name, arrays = next(iter(content.array_records.items()))
    return name, set(arrays)


class _Averaging(Aggregation):
    """FedAvg's training aggregation: running means of arrays and metrics."""

    def __init__(self, strategy: FedAvg, server_round: int) -> None:
        self._strategy = strategy
        self._round = server_round
        self._arrays = ArrayMean()
        self._metrics: list[RecordDict] = []
        self._weights: list[float] = []

    def add(self, reply: Message) -> None:
        if reply.has_error():
            return
        strategy, content = self._strategy, reply.content
        problem = strategy._problem(content, "train")
        if problem is None:
            weight = strategy._weight(content)
            try:
                self._arrays.add(next(iter(content.array_records.values())), weight)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            strategy._log_skipped(self._round, "train", reply, problem)
            return
        # Only the small records are kept; the arrays are folded in and let go.
        self._metrics.append(RecordDict({**content.metric_records, **content.config_records}))
        self._weights.append(weight)

    def result(self) -> tuple[ArrayRecord | None, MetricRecord | None]:
        strategy = self._strategy
        metrics = strategy.train_metrics(self._metrics, self._weights)
        if metrics is None:
            return None, None
        if not self._arrays.weight > 0:
            log.warning(
                "round %d train: all replies weigh 0 examples; model unchanged", self._round
            )
            return None, metrics
        return strategy.server_update(self._round, self._arrays.result()), metrics
