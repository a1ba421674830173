"""What a strategy run produces: the final model and the metrics of every round."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from fedcore.domain import ArrayRecord, Message, MetricRecord
from fedcore.domain.records import MetricValue

Phase: TypeAlias = Literal["train", "evaluate"]
EvaluateFn: TypeAlias = Callable[
    [int, ArrayRecord], Awaitable[MetricRecord | None] | MetricRecord | None
]
StopFn: TypeAlias = Callable[[int, "Result"], Awaitable[bool] | bool]
"""``start``'s ``should_stop(server_round, result)``: true ends the run after that round."""


@dataclass
class Result:
    """The outcome of :meth:`Strategy.start`, with metrics keyed by round (0 = before training)."""

    arrays: ArrayRecord = field(default_factory=ArrayRecord)
    train_metrics_clientapp: dict[int, MetricRecord] = field(default_factory=dict)
    evaluate_metrics_clientapp: dict[int, MetricRecord] = field(default_factory=dict)
    evaluate_metrics_serverapp: dict[int, MetricRecord] = field(default_factory=dict)


NO_REPLY = "no reply"
"""The failure label of a message that got no reply before its round's timeout."""


def failure_label(reply: Message) -> str:
    """How a failed reply is counted: ``"code 2"`` and so on, by its error code."""
    return f"code {reply.error.code}"


@dataclass(frozen=True)
class RoundReport:
    """One finished round, as the round driver logs it (and progress displays read it).

    Each log record of a finished round carries its report as the attribute
    ``fedcore_round``, so a handler can render progress or write metrics without
    parsing text. Training and evaluation are counted apart; failures are counted
    by label — ``"code 2"`` for an error reply with code 2, :data:`NO_REPLY` for a
    message its round stopped waiting for, ``"refused: non-finite"`` and the like for a
    training reply the strategy refused to aggregate (:mod:`fedcore.strategy.replies`).
    """

    server_round: int
    num_rounds: int
    train_replies: int
    evaluate_replies: int
    elapsed: float
    train_failures: dict[str, int] = field(default_factory=dict)
    evaluate_failures: dict[str, int] = field(default_factory=dict)
    train_metrics: dict[str, MetricValue] = field(default_factory=dict)
    evaluate_metrics: dict[str, MetricValue] = field(default_factory=dict)
    server_metrics: dict[str, MetricValue] = field(default_factory=dict)
    stopped_early: bool = False
    """``start``'s ``should_stop`` ended the run after this round, before its last."""

    @property
    def replies(self) -> int:
        """Successful replies, training and evaluation together."""
        return self.train_replies + self.evaluate_replies

    @property
    def failures(self) -> int:
        """Failed or missing replies, training and evaluation together."""
        return sum(self.train_failures.values()) + sum(self.evaluate_failures.values())

    @property
    def trained_nothing(self) -> bool:
        """Training was asked of nodes in this round and none of them delivered."""
        return self.train_replies == 0 and bool(self.train_failures)

    def untrained_reason(self) -> str:
        """Why a run whose last round :attr:`trained_nothing` did not succeed, in one line."""
        return (
            f"the last round ({self.server_round}/{self.num_rounds}) had no successful "
            f"training reply: {failures_text([self.train_failures])}"
        )

    def describe(self) -> str:
        """One line: ``round 3/30: 20 replies, 0 failures, 0.41 s, server accuracy=0.81, …``."""
        parts = [
            f"round {self.server_round}/{self.num_rounds}: {self.replies} replies, "
            f"{self.failures} failures, {self.elapsed:.2f} s"
        ]
        for scope, metrics in (
            ("server", self.server_metrics),
            ("evaluate", self.evaluate_metrics),
            ("train", self.train_metrics),
        ):
            parts.extend(f"{scope} {key}={_short(value)}" for key, value in metrics.items())
        if self.stopped_early:
            parts.append("should_stop ends the run here")
        return ", ".join(parts)


@dataclass(frozen=True)
class ReplyProgress:
    """A reply arrived mid-round; carried by DEBUG records as ``fedcore_reply``."""

    server_round: int
    num_rounds: int
    phase: str
    received: int
    expected: int
    failures: int
    started: float


def _short(value: MetricValue) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:.4g}" for v in value[:4]) + (", …]" if len(value) > 4 else "]")
    return f"{value:.4g}"


def failures_text(tallies: Iterable[Mapping[str, int]]) -> str:
    """``"0 failures"``, or ``"12 failures (code 2 ×10, code 8 ×2)"``: failures by label
    (:attr:`RoundReport.train_failures`, ``evaluate_failures``), added up."""
    counts: Counter[str] = Counter()
    for tally in tallies:
        counts.update(tally)
    total = sum(counts.values())
    if not total:
        return "0 failures"
    return f"{total} failures (" + ", ".join(f"{k} ×{n}" for k, n in counts.most_common()) + ")"


class LastRound(logging.Handler):
    """Hears the rounds a strategy reports (each log record carries its report) and keeps
    the last: how a run that ran to its end is judged (:func:`unfinished_reason`)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: RoundReport | None = None

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "fedcore_round", None)
        if isinstance(report, RoundReport):
            self.last = report


def unfinished_reason(last: RoundReport | None) -> str | None:
    """Why a run whose ``main`` returned did not complete, or ``None`` if it did.

    A run whose last round trained nothing did not complete, whatever ``main`` made of
    it: the simulation and the deployment both end it failed, with this reason.
    """
    if last is not None and last.trained_nothing:
        return last.untrained_reason()
    return None
