"""The round driver: the one loop behind every strategy's ``start``.

Per round: wait (bounded) for enough nodes, shuffle them with the run's seed, let
the strategy build its training messages, push them, take the replies as they
arrive through ``grid.receive``, aggregate; then the same for evaluation, then the
optional server-side evaluation. Replies are put back in the order their messages
were sent before aggregation, so arrival order — which threads and processes make
random — never changes a result: the same seed gives the same model bit for bit.

Every round's configure method gets the same ``train_config`` (and
``evaluate_config``) record — ``start``'s copy of the caller's — as in Flower, so a
strategy that changes it (a learning-rate schedule, ``config["lr"] *= 0.5``) changes
it for the rounds after too; fedcore's own strategies copy it before adding to it.

Each round ends by asking ``start``'s ``should_stop(server_round, result)``, if given
(Flower 1.43's early stopping): true ends the run after that round, the result holding
the rounds done; the round's report says so. It is not asked before the first round.

Where the runtime keeps checkpoints (:mod:`fedcore.strategy.checkpoint`), each round
ends with one, after its report is logged: a run killed between the two goes on from
the round before and does that round again, so no round is recorded twice. A resumed
run starts after its checkpoint's round, with its arrays, metrics, configs and the
strategy's state; a checkpoint taken where ``should_stop`` ended the run says so, and
a run resumed from it runs no round more.

Each finished round is logged once at INFO on ``fedcore.strategy`` with a
:class:`~fedcore.strategy.result.RoundReport` attached (``record.fedcore_round``);
each reply is logged at DEBUG with a :class:`ReplyProgress` (``record.fedcore_reply``)
for live progress displays. Failures are logged at WARNING, grouped by reason.

Each training reply that is not an error goes through the strategy's
``check_train_reply`` with the message it answers before the strategy sees it
(:mod:`fedcore.strategy.replies`): a refused reply is a failure of the round, logged
with its reason and counted under its label (``"refused: non-finite"``), never
aggregated, whatever the order the replies came in.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import numpy as np

import fedcore.defaults as defaults
from fedcore.apps.grid import Grid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, Run
from fedcore.errors import RefusedReplyError
from fedcore.strategy.checkpoint import RoundCheckpoints, active_checkpoints
from fedcore.strategy.protocol import Strategy
from fedcore.strategy.result import (
    NO_REPLY,
    EvaluateFn,
    Phase,
    ReplyProgress,
    Result,
    RoundReport,
    StopFn,
    failure_label,
)

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


DEFAULT_TIMEOUT = 3600.0
"""Seconds ``start`` waits for nodes, and for a round's replies at most, when not told
(Flower's default); also the bound of a configure method's wait when it is given a
Grid (:func:`fedcore.strategy.sampling.candidates`)."""

DEFAULT_ROUND_TIMEOUT = defaults.DEFAULT_ROUND_TIMEOUT
"""Seconds a round phase waits for replies when neither the strategy nor the run says
(:func:`round_limit`): ten minutes, far under a message's default TTL of twelve hours,
so a hung ClientApp costs a round some minutes, not the run its night."""

EXPIRY_GRACE = 1.0
"""Seconds a phase waits past its messages' expiry for the error replies that expiry
brings, so a message that timed out is counted with its code (3), not as missing."""


def round_limit(strategy: Strategy, grid: Grid, timeout: float) -> float:
    """How long each phase of a round waits for replies: the strategy's ``round_timeout``,
    else the run's (``--round-timeout``), else :data:`DEFAULT_ROUND_TIMEOUT`, and never
    more than ``start``'s ``timeout``."""
    own = strategy.round_timeout
    if own is None:
        own = grid.run.round_timeout
    return min(timeout, DEFAULT_ROUND_TIMEOUT if own is None else own)


async def push_within(grid: Grid, messages: Sequence[Message], limit: float) -> list[str]:
    """Push ``messages`` to expire ``limit`` seconds after they are pushed (sooner if they
    would already): a ClientApp still at work when its round stops waiting is stopped,
    and its node does not start work nobody will read. Take their replies with
    :func:`replies_within` and the same ``limit``."""
    for message in messages:
        message.metadata.ttl = min(message.metadata.ttl, limit)
    return await grid.push_messages(messages)


def replies_within(grid: Grid, ids: Sequence[str], limit: float) -> AsyncIterator[Message]:
    """The replies to messages pushed by :func:`push_within`, waited for until ``limit``
    and :data:`EXPIRY_GRACE` more: a message that expired is counted with the error
    reply its expiry brings (code 3), never as missing."""
    return grid.receive(ids, timeout=limit + EXPIRY_GRACE)


@dataclass
class Exchange:
    """What one push-and-receive of a phase yielded."""

    replies: list[Message]
    successes: int
    failures: dict[str, int]
    """Failed replies by label (:func:`~fedcore.strategy.result.failure_label`)."""


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
    should_stop: StopFn | None = None,
) -> Result:
    """Drive ``num_rounds`` rounds of ``strategy`` on ``grid``; see the module docstring."""
    seed = sampling_seed(grid.run)
    log.info("%s: %d rounds, sampling seed %s", type(strategy).__name__, num_rounds, seed)
    rounds = await begin_rounds(
        strategy,
        num_rounds,
        initial_arrays,
        train_config,
        evaluate_config,
        evaluate_fn,
        should_stop,
    )
    result, train_config, evaluate_config = (
        rounds.result,
        rounds.train_config,
        rounds.evaluate_config,
    )
    limit = round_limit(strategy, grid, timeout)
    for server_round in range(rounds.first, num_rounds + 1):
        started = grid.clock.now()
        options = (grid, limit, server_round, num_rounds)
        node_ids = await _candidates(grid, strategy, "train", server_round, seed, timeout)
        messages = strategy.configure_train(server_round, result.arrays, train_config, node_ids)
        aggregation = strategy.train_aggregation(server_round)
        if aggregation is not None:
            train = await exchange(
                messages, *options, "train", fold=aggregation.add, check=strategy.check_train_reply
            )
            arrays, metrics = aggregation.result()
        else:
            train = await exchange(messages, *options, "train", check=strategy.check_train_reply)
            arrays, metrics = strategy.aggregate_train(server_round, train.replies)
        if arrays is not None:
            result.arrays = arrays
        if metrics is not None:
            result.train_metrics_clientapp[server_round] = metrics
        node_ids = await _candidates(grid, strategy, "evaluate", server_round, seed, timeout)
        messages = strategy.configure_evaluate(
            server_round, result.arrays, evaluate_config, node_ids
        )
        evaluate = await exchange(messages, *options, "evaluate")
        metrics = strategy.aggregate_evaluate(server_round, evaluate.replies)
        if metrics is not None:
            result.evaluate_metrics_clientapp[server_round] = metrics
        if evaluate_fn is not None:
            record = await evaluate_on_server(evaluate_fn, server_round, result.arrays)
            if record is not None:
                result.evaluate_metrics_serverapp[server_round] = record
        stop = await rounds.ask_to_stop(server_round)
        report = RoundReport(
            server_round=server_round,
            num_rounds=num_rounds,
            train_replies=train.successes,
            evaluate_replies=evaluate.successes,
            elapsed=grid.clock.now() - started,
            train_failures=train.failures,
            evaluate_failures=evaluate.failures,
            train_metrics=dict(result.train_metrics_clientapp.get(server_round, {})),
            evaluate_metrics=dict(result.evaluate_metrics_clientapp.get(server_round, {})),
            server_metrics=dict(result.evaluate_metrics_serverapp.get(server_round, {})),
            stopped_early=stop,
        )
        log.info("%s", report.describe(), extra={"fedcore_round": report})
        await rounds.keep(server_round)
        if stop:
            break
    return result


@dataclass
class Rounds:
    """Where a ``start``'s rounds begin (:func:`begin_rounds`) and how each is kept."""

    strategy: Strategy
    num_rounds: int
    result: Result
    first: int
    """The first round to run: 1, or the one after a resumed run's checkpoint."""
    train_config: ConfigRecord
    evaluate_config: ConfigRecord
    checkpoints: RoundCheckpoints | None
    should_stop: StopFn | None = None
    stopped: bool = False
    """``should_stop`` ended the run after the last round done (:meth:`ask_to_stop`)."""

    async def ask_to_stop(self, server_round: int) -> bool:
        """Round ``server_round`` is done and in :attr:`result`: does ``should_stop`` end
        the run after it, before its last round? Asked after every round, the last too,
        as Flower asks it."""
        if self.should_stop is not None:
            answer = await ask_should_stop(self.should_stop, server_round, self.result)
            self.stopped = answer and server_round < self.num_rounds
            if self.stopped:
                log.info("should_stop ends the run after round %d of %d", server_round,
                         self.num_rounds)  # fmt: skip
        return self.stopped

    async def keep(self, server_round: int) -> None:
        """Round ``server_round`` ended (its report logged): its checkpoint, if the run
        keeps them."""
        if self.checkpoints is not None:
            await self.checkpoints.save(
                self.strategy,
                server_round,
                self.num_rounds,
                self.result,
                self.train_config,
                self.evaluate_config,
                stopped=self.stopped,
            )


async def begin_rounds(
    strategy: Strategy,
    num_rounds: int,
    initial_arrays: ArrayRecord,
    train_config: ConfigRecord,
    evaluate_config: ConfigRecord,
    evaluate_fn: EvaluateFn | None,
    should_stop: StopFn | None = None,
) -> Rounds:
    """How a ``start`` of ``strategy`` begins: from the run's checkpoint, when it is
    resumed (its arrays, metrics, configs and the strategy's state; nothing left to run
    when ``should_stop`` had ended the run there); else from ``initial_arrays``,
    evaluated on the server first when there is ``evaluate_fn``. With ``num_rounds``
    0 that is the whole run: its result holds ``initial_arrays``."""
    checkpoints = active_checkpoints()
    resumed = None if checkpoints is None else checkpoints.begin(strategy, num_rounds)
    if resumed is not None:
        strategy.load_state(resumed.strategy_state)
        done = resumed.server_round
        if resumed.stopped:
            log.info("should_stop ended the run after round %d of %d: no round left to run",
                     done, num_rounds)  # fmt: skip
        else:
            log.info("resuming after round %d of %d, from its checkpoint", done, num_rounds)
        first = num_rounds + 1 if resumed.stopped else done + 1
        return Rounds(strategy, num_rounds, resumed.result, first, resumed.train_config,
                      resumed.evaluate_config, checkpoints, should_stop,
                      resumed.stopped)  # fmt: skip
    result = Result(arrays=initial_arrays)
    if evaluate_fn is not None:
        record = await evaluate_on_server(evaluate_fn, 0, initial_arrays)
        if record is not None:
            result.evaluate_metrics_serverapp[0] = record
            log.info("initial server evaluation: %s", metrics_text(record))
    return Rounds(strategy, num_rounds, result, 1, train_config, evaluate_config, checkpoints,
                  should_stop)  # fmt: skip


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


HELD_REPLIES = 32
"""How many replies may wait for an earlier one before folding goes by arrival order."""


class _InOrder:
    """Hands replies on in the order their messages were sent.

    A reply that arrives before an earlier message's is held. In simulation, where
    messages are served about in send order, a few are held at a time; should more
    than :data:`HELD_REPLIES` wait on one straggler, the earliest held is passed on
    at once — memory stays bounded, and that round's result may then differ in its
    last bits from a run where the straggler came in time.
    """

    def __init__(self, ids: Sequence[str], deliver: Callable[[Message], None]) -> None:
        self._position = {message_id: index for index, message_id in enumerate(ids)}
        self._deliver = deliver
        self._held: dict[int, Message] = {}
        self._next = 0

    def add(self, reply: Message) -> None:
        self._held[self._position[reply.metadata.reply_to_message_id]] = reply
        while self._next in self._held:
            self._deliver(self._held.pop(self._next))
            self._next += 1
        while len(self._held) > HELD_REPLIES:
            self._deliver(self._held.pop(min(self._held)))

    def finish(self) -> None:
        """Pass on what is still held (its predecessors never came), in send order."""
        for index in sorted(self._held):
            self._deliver(self._held.pop(index))


async def exchange(
    messages: Sequence[Message],
    grid: Grid,
    timeout: float,
    server_round: int,
    num_rounds: int,
    phase: Phase,
    fold: Callable[[Message], None] | None = None,
    check: Callable[[Message, Message], Message] | None = None,
) -> Exchange:
    """Push ``messages`` and take their replies: folded in with ``fold`` in send order,
    or (without ``fold``) returned as a list in send order. Messages expire after
    ``timeout`` seconds (:func:`push_within`); what has no reply by then is a failure.
    ``check(sent, reply)`` (a strategy's ``check_train_reply``) gives each reply that is
    not an error as it is to be aggregated, or refuses it: a refused reply is a failure
    (:func:`refusal`), neither folded nor returned."""
    if not messages:
        return Exchange([], 0, {})
    started = grid.clock.now()
    ids = await push_within(grid, messages, timeout)
    replies: list[Message] = []
    take = fold if fold is not None else replies.append
    refused: list[str] = []
    sent = dict(zip(ids, messages, strict=True))

    def deliver(reply: Message) -> None:
        if check is not None and not reply.has_error():
            try:
                reply = check(sent[reply.metadata.reply_to_message_id], reply)
            except RefusedReplyError as exc:
                refused.append(refusal(server_round, reply, exc))
                return
        take(reply)

    in_order = _InOrder(ids, deliver)
    errors: list[Message] = []
    received = 0
    async for reply in replies_within(grid, ids, timeout):
        received += 1
        if reply.has_error():
            errors.append(reply)
        in_order.add(reply)
        if log.isEnabledFor(logging.DEBUG):
            progress = ReplyProgress(
                server_round, num_rounds, phase, received, len(ids), len(errors), started
            )
            log.debug(
                "%s reply %d/%d", phase, received, len(ids), extra={"fedcore_reply": progress}
            )
    in_order.finish()
    missing = len(ids) - received
    if errors or missing:
        log_failures(server_round, phase, errors, missing, timeout)
    successes = received - len(errors) - len(refused)
    return Exchange(replies, successes, failure_counts(errors, missing, refused))


def refusal(server_round: int, reply: Message, exc: RefusedReplyError) -> str:
    """Log at WARNING that ``reply`` was refused, and why; the label it is counted under."""
    log.warning(
        "round %d train: reply from node %d not aggregated (%s): %s",
        server_round,
        reply.metadata.src_node_id,
        exc.label,
        exc,
    )
    return exc.label


def failure_counts(
    errors: list[Message], missing: int, refused: Sequence[str] = ()
) -> dict[str, int]:
    """Failures by label, most frequent first: error replies by code, missing replies,
    and replies the strategy refused by their refusal's label."""
    counts = Counter(failure_label(reply) for reply in errors)
    counts.update(refused)
    if missing:
        counts[NO_REPLY] += missing
    return dict(counts.most_common())


def log_failures(
    server_round: int, phase: Phase, errors: list[Message], missing: int, timeout: float
) -> None:
    reasons = Counter(reply.error.describe() for reply in errors)
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


async def evaluate_on_server(
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


async def ask_should_stop(should_stop: StopFn, server_round: int, result: Result) -> bool:
    """``should_stop(server_round, result)``'s answer, awaited if it is a coroutine.

    Called on the event loop, between rounds, like a predicate: it must be quick (an
    ``async def`` one may await). ``result`` is the run's own, not a copy: it must
    not be changed.
    """
    answer: Any = should_stop(server_round, result)
    if inspect.isawaitable(answer):
        answer = await answer
    return bool(answer)


def metrics_text(record: MetricRecord) -> str:
    return ", ".join(f"{key}={value}" for key, value in record.items())
