"""The round driver: the one loop behind every strategy's ``start``.

Per round: wait (bounded) for enough nodes, shuffle them with the run's seed, let
the strategy build its training messages, push them, take the replies as they
arrive through ``grid.receive``, aggregate; then the same for evaluation, then the
optional server-side evaluation. Replies are put back in the order their messages
were sent before aggregation, so arrival order — which threads and processes make
random — never changes a result: the same seed gives the same model bit for bit.

Each finished round is logged once at INFO on ``fedcore.strategy`` with a
:class:`~fedcore.strategy.result.RoundReport` attached (``record.fedcore_round``);
each reply is logged at DEBUG with a :class:`ReplyProgress` (``record.fedcore_reply``)
for live progress displays. Failures are logged at WARNING, grouped by reason.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import numpy as np

from fedcore.apps.grid import Grid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, Run
from fedcore.strategy.result import EvaluateFn, Phase, ReplyProgress, Result, RoundReport

if TYPE_CHECKING:
    from fedcore.strategy.base import Strategy

log = logging.getLogger("fedcore.strategy")

_PHASES: tuple[Phase, ...] = ("train", "evaluate")


def sampling_seed(run: Run) -> int | None:
    """The run's seed, else its run config's integer ``seed``, else ``None``."""
    if run.seed is not None:
        return run.seed
    seed = run.run_config.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else None


def shuffled(
    node_ids: Iterable[int], seed: int | None, server_round: int, phase: Phase
) -> list[int]:
    """``node_ids`` in an order fixed by (seed, round, phase); random when ``seed`` is None."""
    ordered = sorted(node_ids)
    entropy = None if seed is None else [seed, server_round, _PHASES.index(phase)]
    permutation = np.random.default_rng(entropy).permutation(len(ordered))
    return [ordered[i] for i in permutation]


@dataclass
class _Exchange:
    replies: list[Message]
    failures: int


async def run_rounds(
    strategy: Strategy,
    grid: Grid,
    *,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord,
    evaluate_config: ConfigRecord,
    evaluate_fn: EvaluateFn | None,
) -> Result:
    """Drive ``num_rounds`` rounds of ``strategy`` on ``grid``; see the module docstring."""
    seed = sampling_seed(grid.run)
    log.info("%s: %d rounds, sampling seed %s", type(strategy).__name__, num_rounds, seed)
    result = Result(arrays=initial_arrays)
    if evaluate_fn is not None:
        record = await _evaluate_on_server(evaluate_fn, 0, initial_arrays)
        if record is not None:
            result.evaluate_metrics_serverapp[0] = record
            log.info("initial server evaluation: %s", _metrics_text(record))
    for server_round in range(1, num_rounds + 1):
        started = grid.clock.now()
        replies = failures = 0
        for phase in _PHASES:
            node_ids = await _candidates(grid, strategy, phase, server_round, seed, timeout)
            if phase == "train":
                messages = strategy.configure_train(
                    server_round, result.arrays, ConfigRecord(train_config), node_ids
                )
            else:
                messages = strategy.configure_evaluate(
                    server_round, result.arrays, ConfigRecord(evaluate_config), node_ids
                )
            exchange = await _exchange(grid, messages, timeout, server_round, num_rounds, phase)
            replies += len(exchange.replies) - exchange.failures
            failures += exchange.failures
            if phase == "train":
                arrays, metrics = strategy.aggregate_train(server_round, exchange.replies)
                if arrays is not None:
                    result.arrays = arrays
                if metrics is not None:
                    result.train_metrics_clientapp[server_round] = metrics
            else:
                metrics = strategy.aggregate_evaluate(server_round, exchange.replies)
                if metrics is not None:
                    result.evaluate_metrics_clientapp[server_round] = metrics
        if evaluate_fn is not None:
            record = await _evaluate_on_server(evaluate_fn, server_round, result.arrays)
            if record is not None:
                result.evaluate_metrics_serverapp[server_round] = record
        report = RoundReport(
            server_round=server_round,
            num_rounds=num_rounds,
            replies=replies,
            failures=failures,
            elapsed=grid.clock.now() - started,
            train_metrics=dict(result.train_metrics_clientapp.get(server_round, {})),
            evaluate_metrics=dict(result.evaluate_metrics_clientapp.get(server_round, {})),
            server_metrics=dict(result.evaluate_metrics_serverapp.get(server_round, {})),
        )
        log.info("%s", report.describe(), extra={"fedcore_round": report})
    return result


async def _candidates(
    grid: Grid,
    strategy: Strategy,
    phase: Phase,
    server_round: int,
    seed: int | None,
    timeout: float,
) -> list[int]:
    needed = strategy.min_nodes(phase)
    if needed <= 0:
        return []
    node_ids = await grid.wait_for_nodes(needed, timeout=timeout)
    return shuffled(node_ids, seed, server_round, phase)


async def _exchange(
    grid: Grid,
    messages: Sequence[Message],
    timeout: float,
    server_round: int,
    num_rounds: int,
    phase: Phase,
) -> _Exchange:
    if not messages:
        return _Exchange([], 0)
    started = grid.clock.now()
    ids = await grid.push_messages(messages)
    replies: list[Message] = []
    errors: list[Message] = []
    async for reply in grid.receive(ids, timeout=timeout):
        replies.append(reply)
        if reply.has_error():
            errors.append(reply)
        if log.isEnabledFor(logging.DEBUG):
            progress = ReplyProgress(
                server_round, num_rounds, phase, len(replies), len(ids), len(errors), started
            )
            log.debug(
                "%s reply %d/%d", phase, len(replies), len(ids), extra={"fedcore_reply": progress}
            )
    missing = len(ids) - len(replies)
    if errors or missing:
        _log_failures(server_round, phase, errors, missing, timeout)
    position = {message_id: index for index, message_id in enumerate(ids)}
    replies.sort(key=lambda reply: position[reply.metadata.reply_to_message_id])
    return _Exchange(replies, len(errors) + missing)


def _log_failures(
    server_round: int, phase: Phase, errors: list[Message], missing: int, timeout: float
) -> None:
    reasons = Counter(str(reply.error) for reply in errors)
    if missing:
        reasons[f"no reply within the {timeout:g} s timeout"] += missing
    summary = "; ".join(f"{count}× {reason}" for reason, count in reasons.most_common(3))
    more = len(reasons) - 3
    log.warning(
        "round %d %s: %d failures: %s%s",
        server_round,
        phase,
        len(errors) + missing,
        summary,
        f" (and {more} other reasons)" if more > 0 else "",
    )


async def _evaluate_on_server(
    evaluate_fn: EvaluateFn, server_round: int, arrays: ArrayRecord
) -> MetricRecord | None:
    if inspect.iscoroutinefunction(evaluate_fn):
        outcome: Any = await evaluate_fn(server_round, arrays)
    else:
        outcome = await anyio.to_thread.run_sync(evaluate_fn, server_round, arrays)
        if inspect.isawaitable(outcome):
            outcome = await outcome
    if outcome is not None and not isinstance(outcome, MetricRecord):
        raise TypeError(
            f"evaluate_fn must return a MetricRecord or None, got {type(outcome).__name__}"
        )
    return outcome


def _metrics_text(record: MetricRecord) -> str:
    return ", ".join(f"{key}={value}" for key, value in record.items())
