"""Strategy: how a ServerApp chooses nodes and combines their replies.

A strategy is four pure methods — ``configure_train``, ``aggregate_train``,
``configure_evaluate``, ``aggregate_evaluate`` — that a test can call with plain
lists, and :meth:`Strategy.start`, which hands them to the one round driver in
:mod:`fedcore.strategy.rounds`. The configure methods receive the candidate node
ids already shuffled with the run's seed and take them in that order, so the
sampling is reproducible without the strategy touching a random generator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from typing import Any, overload

import anyio.from_thread

from fedcore.apps.grid import Grid, SyncGrid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord
from fedcore.strategy.result import EvaluateFn, Phase, Result
from fedcore.strategy.rounds import run_rounds


class Aggregation(ABC):
    """Combines one round's training replies as they arrive.

    A strategy whose math allows it (a mean, a sum) returns one from
    :meth:`Strategy.train_aggregation`; the round driver then folds each reply in
    and drops it, so a round holds one model's worth of memory rather than one per
    reply. Strategies that need every reply at once (a median, Krum) return ``None``
    and get the whole list in ``aggregate_train``.
    """

    @abstractmethod
    def add(self, reply: Message) -> None:
        """Fold in one reply (an error reply is a failure: counted elsewhere, never used)."""

    @abstractmethod
    def result(self) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """What ``aggregate_train`` returns for the replies added."""


class Strategy(ABC):
    """The base of every strategy."""

    round_timeout: float | None = None
    """Seconds each phase of a round (training, then evaluation) waits for its replies;
    a ClientApp still running then is stopped and its reply counted as a failure.
    ``None``: the run's default (``fedcore simulate --round-timeout``), else
    :data:`~fedcore.strategy.rounds.DEFAULT_ROUND_TIMEOUT`. Strategies take it as a
    constructor argument."""

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """A running aggregation of training replies, or ``None`` to get them as a list."""
        return None

    @abstractmethod
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        """The training messages of a round, for nodes chosen from ``node_ids`` in order."""

    @abstractmethod
    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Combine training replies into new arrays and metrics (``None``: nothing to combine)."""

    @abstractmethod
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        """The evaluation messages of a round, for nodes chosen from ``node_ids`` in order."""

    @abstractmethod
    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        """Combine evaluation replies into metrics."""

    def min_nodes(self, phase: Phase) -> int:
        """Online nodes to wait for before configuring ``phase`` (0: do not wait)."""
        return 1

    @overload
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Awaitable[Result]: ...

    @overload
    def start(
        self,
        grid: SyncGrid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result: ...

    def start(
        self,
        grid: Grid | SyncGrid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Awaitable[Result] | Result:
        """Run ``num_rounds`` of training and evaluation; return the final arrays and metrics.

        ``await strategy.start(grid=grid, ...)`` in an ``async def main``; plain
        ``strategy.start(grid=grid, ...)`` with the blocking grid of a ``def main``.
        ``timeout`` bounds, in seconds, each wait for nodes and each round's
        replies; late replies count as failures. The strategy's ``round_timeout``
        bounds the replies too, and is usually the shorter. ``evaluate_fn(round, arrays)``
        evaluates on the server after every round (and once before the first).
        """
        if not isinstance(initial_arrays, ArrayRecord):
            raise TypeError(
                f"initial_arrays must be an ArrayRecord, got {type(initial_arrays).__name__}"
            )
        if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 0:
            raise ValueError(f"num_rounds must be a non-negative int, got {num_rounds!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        options: dict[str, Any] = {
            "initial_arrays": initial_arrays,
            "num_rounds": num_rounds,
            "timeout": float(timeout),
            "train_config": ConfigRecord(train_config or {}),
            "evaluate_config": ConfigRecord(evaluate_config or {}),
            "evaluate_fn": evaluate_fn,
        }
        if isinstance(grid, SyncGrid):
            async_grid = grid.async_grid

            async def drive() -> Result:
                return await self.drive(async_grid, **options)

            return anyio.from_thread.run(drive)
        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a Grid, got {type(grid).__name__}")
        return self.drive(grid, **options)

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
    ) -> Result:
        """The loop behind :meth:`start`, with its arguments checked: synchronous rounds
        (:func:`~fedcore.strategy.rounds.run_rounds`). A strategy with a schedule of its
        own — FedBuff's asynchronous one — overrides this and keeps the pure methods."""
        return await run_rounds(
            self,
            grid,
            initial_arrays=initial_arrays,
            num_rounds=num_rounds,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
        )
