"""FedBuff: buffered asynchronous aggregation (Nguyen et al., AISTATS 2022).

Synchronous rounds wait for the slowest node sampled; FedBuff does not wait at all. It
keeps ``concurrency`` nodes training at every moment, each started from the newest
model (the asynchronous driver, :mod:`fedcore.strategy.async_rounds`). Each reply's
update — its arrays minus the arrays it was trained from — goes into a buffer,
down-weighted by its staleness ``τ`` (how many new models appeared while it trained)
as ``(1 + τ) ** -staleness_exponent``; every ``buffer_size`` replies the buffer
becomes one server step::

    model += server_learning_rate × Σ nᵢ·s(τᵢ)·Δᵢ / Σ nᵢ

with ``nᵢ`` the reply's ``weighted_by_key`` metric. A stale update therefore moves the
model less, and a straggler only delays its own contribution, never a round. One
"round" of :meth:`FedBuff.start` is one server step. Optional federated evaluation
(``fraction_evaluate`` > 0, off by default) of each new model runs beside training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np

from fedcore.apps.grid import Grid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import ArrayMean, cast_back, check_same_layout
from fedcore.strategy.async_rounds import run_async_rounds
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.result import EvaluateFn, Result, StopFn
from fedcore.strategy.sampling import Nodes

log = logging.getLogger("fedcore.strategy")


class FedBuff(FedAvg):
    """Buffered asynchronous federated learning; see the module docstring.

    ``concurrency`` nodes train at once (fewer if fewer are online); every
    ``buffer_size`` outcomes make one server step. Updates staler than
    ``max_staleness`` models (if set) are dropped. The other arguments are FedAvg's;
    ``fraction_train`` and ``min_train_nodes`` have no meaning here, as the
    scheduler starts a node whenever a training slot frees up.
    """

    def __init__(
        self,
        buffer_size: int = 10,
        concurrency: int = 20,
        server_learning_rate: float = 1.0,
        staleness_exponent: float = 0.5,
        max_staleness: int | None = None,
        *,
        fraction_evaluate: float = 0.0,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        round_timeout: float | None = None,
        validate_replies: bool = True,
    ) -> None:
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=0,
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
        self.buffer_size = arguments.count("buffer_size", buffer_size, minimum=1)
        self.concurrency = arguments.count("concurrency", concurrency, minimum=1)
        self.server_learning_rate = arguments.positive("server_learning_rate", server_learning_rate)
        self.staleness_exponent = arguments.non_negative("staleness_exponent", staleness_exponent)
        self.max_staleness = (
            None if max_staleness is None else arguments.count("max_staleness", max_staleness)
        )
        self._sent: dict[int, ArrayRecord] = {}

    def __repr__(self) -> str:
        return (
            f"FedBuff(buffer_size={self.buffer_size}, concurrency={self.concurrency}, "
            f"server_learning_rate={self.server_learning_rate}, "
            f"staleness_exponent={self.staleness_exponent}, max_staleness={self.max_staleness})"
        )

    def staleness_weight(self, staleness: int) -> float:
        """How much an update trained ``staleness`` models ago counts: ``(1 + τ)^-a``."""
        return float((1 + staleness) ** -self.staleness_exponent)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        """Training messages for every node in ``node_ids`` (the scheduler's choice),
        starting from ``arrays``, the model that step ``server_round`` will update."""
        self._sent[server_round] = arrays
        return super().configure_train(server_round, arrays, config, node_ids)

    def train_aggregation(self, server_round: int) -> _Buffer:
        """The buffer of step ``server_round``: it updates the arrays last sent for it."""
        base = self._sent.get(server_round)
        if base is None:
            raise ValueError(f"no arrays were configured for round {server_round}")
        return _Buffer(self, server_round, base)

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        buffer = self.train_aggregation(server_round)
        for reply in replies:
            buffer.add(reply)
        return buffer.result()

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the arrays sent for every round not in ``keep`` (no update is due from them)."""
        kept = set(keep)
        for server_round in [r for r in self._sent if r not in kept]:
            del self._sent[server_round]

    async def drive(
        self,
        grid: Grid,
        *,
        initial_arrays: ArrayRecord,
        num_rounds: int,
        timeout: float,
        train_config: ConfigRecord,
        evaluate_config: ConfigRecord,
        evaluate_fn: EvaluateFn | None,
        should_stop: StopFn | None = None,
    ) -> Result:
        """Train on the asynchronous driver
        (:func:`~fedcore.strategy.async_rounds.run_async_rounds`) until ``num_rounds``
        server steps are made, or ``should_stop`` ends the run after one."""
        self._sent.clear()
        return await run_async_rounds(
            self,
            grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
            should_stop=should_stop,
        )


def _step(base: ArrayRecord, step: ArrayRecord, scale: float) -> ArrayRecord:
    """``base + scale × step``, each array back in its own dtype (integers rounded)."""
    return ArrayRecord(
        {
            key: cast_back(array.astype(np.float64) + scale * step[key], array.dtype)
            for key, array in base.items()
        }
    )


class _Buffer(Aggregation):
    """One server step's buffer: staleness-weighted updates folded in as they arrive."""

    def __init__(self, strategy: FedBuff, server_round: int, base: ArrayRecord) -> None:
        self._strategy = strategy
        self._round = server_round
        self._base = base
        self._updates = ArrayMean()
        self._examples = 0.0
        self._records: list[RecordDict] = []
        self._weights: list[float] = []
        self._staleness: list[int] = []

    @property
    def server_round(self) -> int:
        """The step this buffer makes."""
        return self._round

    def add(self, reply: Message) -> None:
        if reply.has_error():
            return
        strategy = self._strategy
        try:
            update, staleness = self._update(reply)
        except ValueError as exc:
            strategy._log_skipped(self._round, "train", reply, str(exc))
            return
        content = reply.content
        examples = strategy._weight(content)
        self._updates.add(update, examples * strategy.staleness_weight(staleness))
        self._examples += examples
        self._records.append(RecordDict({**content.metric_records, **content.config_records}))
        self._weights.append(examples)
        self._staleness.append(staleness)

    def _update(self, reply: Message) -> tuple[ArrayRecord, int]:
        """The reply's update and staleness; ``ValueError`` says why it cannot be used."""
        strategy, content = self._strategy, reply.content
        problem = strategy._problem(content, "train")
        if problem is not None:
            raise ValueError(problem)
        group = reply.metadata.group_id
        sent = int(group) if group.isdigit() else None
        if sent is None or sent > self._round or sent not in strategy._sent:
            raise ValueError(f"it answers a message of unknown round {group!r}")
        staleness = self._round - sent
        if strategy.max_staleness is not None and staleness > strategy.max_staleness:
            raise ValueError(
                f"it is {staleness} models stale (max_staleness={strategy.max_staleness})"
            )
        arrays = next(iter(content.array_records.values()))
        origin = strategy._sent[sent]
        check_same_layout(self._base, arrays)
        check_same_layout(self._base, origin)
        update = {key: np.asarray(arrays[key].astype(np.float64) - origin[key]) for key in arrays}
        return ArrayRecord(update), staleness

    @property
    def size(self) -> int:
        """Updates folded in so far."""
        return len(self._records)

    def result(self) -> tuple[ArrayRecord | None, MetricRecord | None]:
        strategy = self._strategy
        metrics = strategy.train_metrics(self._records, self._weights)
        if metrics is None:
            return None, None
        if strategy.train_metrics_aggr_fn is None:
            metrics["staleness"] = float(np.mean(self._staleness))
        if not self._updates.weight > 0:
            log.warning("round %d train: all updates weigh 0; model unchanged", self._round)
            return None, metrics
        # ArrayMean divides by Σ n·s; the step divides by Σ n, so stale updates count less.
        scale = strategy.server_learning_rate * self._updates.weight / self._examples
        return _step(self._base, self._updates.result(), scale), metrics
