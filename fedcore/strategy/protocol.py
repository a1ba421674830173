"""What a round driver needs of a strategy: the :class:`Strategy` protocol.

The drivers (:mod:`fedcore.strategy.rounds`, :mod:`fedcore.strategy.async_rounds`) and
the checkpoints they keep depend on this, not on the base class in
:mod:`fedcore.strategy.base`, which is built on the synchronous driver: so the base
sits above its driver, not under it. :class:`Aggregation` is here because the
protocol's ``train_aggregation`` hands one back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy.result import Phase


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


class Strategy(Protocol):
    """A strategy as a driver uses it; :class:`fedcore.strategy.base.Strategy` says what
    each member means. The driver hands the configure methods node ids, never a Grid."""

    @property
    def round_timeout(self) -> float | None: ...

    def min_nodes(self, phase: Phase) -> int: ...

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]: ...

    def train_aggregation(self, server_round: int) -> Aggregation | None: ...

    def check_train_reply(self, sent: Message, reply: Message) -> Message: ...

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]: ...

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]: ...

    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None: ...

    def state(self) -> RecordDict: ...

    def load_state(self, state: RecordDict) -> None: ...
