"""Strategy: how a ServerApp chooses nodes and combines their replies.

A strategy is four pure methods — ``configure_train``, ``aggregate_train``,
``configure_evaluate``, ``aggregate_evaluate`` — that a test can call with plain
lists, and :meth:`Strategy.start`, which hands them to the one round driver in
:mod:`fedcore.strategy.rounds`. The configure methods receive the candidate node
ids already shuffled with the run's seed and take them in that order, so the
sampling is reproducible without the strategy touching a random generator. They
also take a Grid instead, as Flower's do, and then sample through it the same way
(:mod:`fedcore.strategy.sampling`). :meth:`Strategy.summary` logs the settings, and
:func:`log_strategy_start_info` what a run starts with, for a ``start`` of one's own
(Flower's ``strategy_utils`` names).
"""

from __future__ import annotations

import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence
from typing import Any, overload

import anyio.from_thread

from fedcore.apps.grid import Grid, SyncGrid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.strategy import replies as reply_checks
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.result import EvaluateFn, Phase, Result, StopFn
from fedcore.strategy.rounds import DEFAULT_TIMEOUT, run_rounds
from fedcore.strategy.sampling import Nodes

log = logging.getLogger("fedcore.strategy")


class Strategy(ABC):
    """The base of every strategy: the :class:`~fedcore.strategy.protocol.Strategy` a
    driver needs, with ``start`` and the settings' summary on top."""

    round_timeout: float | None = None
    """Seconds each phase of a round (training, then evaluation) waits for its replies;
    a ClientApp still running then is stopped and its reply counted as a failure.
    ``None``: the run's default (``fedcore simulate --round-timeout``), else
    :data:`~fedcore.strategy.rounds.DEFAULT_ROUND_TIMEOUT`. Strategies take it as a
    constructor argument."""

    validate_replies: bool = True
    """Check every training reply against the message it answers before it is aggregated
    (:meth:`check_train_reply`); a refused reply is a failure of its round, counted in
    its summary. ``False`` keeps Flower's permissive behaviour: replies are aggregated
    as they come, NaN and all. Strategies take it as a keyword argument."""

    def check_train_reply(self, sent: Message, reply: Message) -> Message:
        """``reply``, a training reply that is not an error, as it may be aggregated —
        itself, or with arrays of another precision cast to the dtypes ``sent`` had —
        or :class:`~fedcore.errors.RefusedReplyError` if it must not be. The round
        driver calls this for every such reply with ``sent``, the message it answers,
        aggregates what it returns and counts a refused one as a failure; a loop of
        one's own that calls :meth:`aggregate_train` calls it too. The base checks the
        arrays (:func:`fedcore.strategy.replies.check_train_reply`), FedAvg the weight
        as well. Returns ``reply`` unchecked when :attr:`validate_replies` is false."""
        if not self.validate_replies:
            return reply
        content = reply_checks.check_train_reply(sent.content, reply.content)
        return reply if content is reply.content else reply.with_content(content)

    def train_aggregation(self, server_round: int) -> Aggregation | None:
        """A running aggregation of training replies, or ``None`` to get them as a list."""
        return None

    @abstractmethod
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        """The training messages of a round, for nodes chosen from ``node_ids`` in order
        (or, given a Grid as Flower passes one, from the nodes sampled through it)."""

    @abstractmethod
    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Combine training replies into new arrays and metrics (``None``: nothing to combine)."""

    @abstractmethod
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Nodes
    ) -> list[Message]:
        """The evaluation messages of a round, for nodes chosen from ``node_ids`` in order
        (or, given a Grid, from the nodes sampled through it)."""

    @abstractmethod
    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        """Combine evaluation replies into metrics."""

    def min_nodes(self, phase: Phase) -> int:
        """Online nodes to wait for before configuring ``phase`` (0: do not wait)."""
        return 1

    def state(self) -> RecordDict:
        """What the strategy learned in its rounds that its next round needs, beyond the
        model: a server optimizer's moments, an adaptive clipping norm. A run's checkpoint
        keeps it after every round (:mod:`fedcore.strategy.checkpoint`), and a resumed
        run hands it back to :meth:`load_state` of a strategy built with the same
        arguments, so that the rounds after go exactly as they would have. A strategy
        whose rounds depend only on its arguments and the model keeps none (the default).
        A strategy of one's own with such state overrides both methods."""
        return RecordDict()

    def load_state(self, state: RecordDict) -> None:
        """Take back what :meth:`state` returned, before the rounds that follow it."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state between rounds, but was given "
                f"{', '.join(map(repr, state))}: a checkpoint of another strategy?"
            )

    def settings(self) -> dict[str, object]:
        """What :meth:`summary` shows: each argument of the constructors of the strategy's
        class and its bases that the strategy keeps as an attribute of the same name —
        its arguments are its settings, so a new strategy is summarised without code of
        its own. A strategy with state besides them (an adaptive clipping norm) adds it."""
        names: dict[str, None] = {}
        for cls in type(self).__mro__:
            init = vars(cls).get("__init__")
            if init is None or cls in (Strategy, ABC, object):
                continue
            for parameter in inspect.signature(init).parameters.values():
                if parameter.name != "self" and parameter.kind not in _VARIADIC:
                    names.setdefault(parameter.name)
        return {name: getattr(self, name) for name in names if hasattr(self, name)}

    def summary(self) -> str:
        """Log the strategy's settings (:meth:`settings`) at INFO on ``fedcore.strategy``,
        one a line, as Flower's ``summary()`` does, and return them as text; a wrapped
        strategy's settings are nested under its argument."""
        lines = _summary_lines(self)
        for line in lines:
            log.info("%s", line)
        return "\n".join(lines)

    @overload
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = DEFAULT_TIMEOUT,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        should_stop: StopFn | None = None,
    ) -> Awaitable[Result]: ...

    @overload
    def start(
        self,
        grid: SyncGrid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = DEFAULT_TIMEOUT,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        should_stop: StopFn | None = None,
    ) -> Result: ...

    def start(
        self,
        grid: Grid | SyncGrid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = DEFAULT_TIMEOUT,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        should_stop: StopFn | None = None,
    ) -> Awaitable[Result] | Result:
        """Run ``num_rounds`` of training and evaluation; return the final arrays and metrics.

        ``await strategy.start(grid=grid, ...)`` in an ``async def main``; plain
        ``strategy.start(grid=grid, ...)`` with the blocking grid of a ``def main``.
        ``timeout`` bounds, in seconds, each wait for nodes and each round's
        replies; late replies count as failures. The strategy's ``round_timeout``
        bounds the replies too, and is usually the shorter. ``evaluate_fn(round, arrays)``
        evaluates on the server after every round (and once before the first).
        ``should_stop(round, result)`` (Flower 1.43's early stopping) is asked after
        every round, with the result so far; true ends the run there, and the result
        holds the rounds done. ``num_rounds=0`` runs no round: the result holds
        ``initial_arrays``.
        """
        if not isinstance(initial_arrays, ArrayRecord):
            raise TypeError(
                f"initial_arrays must be an ArrayRecord, got {type(initial_arrays).__name__}"
            )
        if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 0:
            raise ValueError(f"num_rounds must be a non-negative int, got {num_rounds!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if should_stop is not None and not callable(should_stop):
            raise TypeError(
                f"should_stop must be a callable(round, result), got {type(should_stop).__name__}"
            )
        options: dict[str, Any] = {
            "initial_arrays": initial_arrays,
            "num_rounds": num_rounds,
            "timeout": float(timeout),
            "train_config": ConfigRecord(train_config or {}),
            "evaluate_config": ConfigRecord(evaluate_config or {}),
            "evaluate_fn": evaluate_fn,
            "should_stop": should_stop,
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
        should_stop: StopFn | None = None,
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
            should_stop=should_stop,
        )


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def config_to_str(config: ConfigRecord) -> str:
    """``config`` as one line for a log, as Flower writes it: each value as ``str()`` shows
    it, a bytes value masked (a serialised model or a key has no place in a log):
    ``{'lr': 0.1, 'optimizer': adam, 'blob': <bytes>}``."""
    items = (
        f"{key!r}: {'<bytes>' if isinstance(value, bytes) else value}"
        for key, value in config.items()
    )
    return "{" + ", ".join(items) + "}"


def log_strategy_start_info(
    num_rounds: int,
    arrays: ArrayRecord,
    train_config: ConfigRecord | None,
    evaluate_config: ConfigRecord | None,
) -> None:
    """Log at INFO on ``fedcore.strategy`` what a run starts with: its rounds, the size
    of its initial arrays, its train and evaluate configs (:func:`config_to_str`).

    Flower's ``strategy_utils.log_strategy_start_info``, which a strategy with a
    ``start`` of its own calls before its rounds, as Flower's ``start`` does.
    """
    log.info("├── rounds: %d", num_rounds)
    log.info("├── arrays: %d (%.2f MB)", len(arrays), arrays.count_bytes() / 2**20)
    for phase, config in (("train", train_config), ("evaluate", evaluate_config)):
        shown = config_to_str(config) if config else "(empty)"
        log.info("%s── %s config: %s", "└" if phase == "evaluate" else "├", phase, shown)


def _summary_lines(strategy: Strategy) -> list[str]:
    """``strategy``'s name, then one ``├── name: value`` line per setting, a wrapped
    strategy's lines indented beneath its own."""
    lines = [type(strategy).__name__]
    settings = list(strategy.settings().items())
    for index, (name, value) in enumerate(settings):
        last = index == len(settings) - 1
        branch, indent = ("└── ", "    ") if last else ("├── ", "│   ")
        if isinstance(value, Strategy):
            head, *rest = _summary_lines(value)
            lines.append(f"{branch}{name}: {head}")
            lines.extend(indent + line for line in rest)
        else:
            lines.append(f"{branch}{name}: {_setting_text(value)}")
    return lines


def _setting_text(value: object) -> str:
    if callable(value) and hasattr(value, "__qualname__"):
        return str(value.__qualname__)
    return repr(value)
