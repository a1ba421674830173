"""FedBuff: buffered asynchronous aggregation (Nguyen et al., AISTATS 2022).

Synchronous rounds wait for the slowest node sampled; FedBuff does not wait at all. It
keeps ``concurrency`` nodes training at every moment: whenever one answers, another
is started from the newest model. Each reply's update — its arrays minus the arrays
it was trained from — goes into a buffer, down-weighted by its staleness ``τ`` (how
many new models appeared while it trained) as ``(1 + τ) ** -staleness_exponent``;
every ``buffer_size`` replies the buffer becomes one server step::

    model += server_learning_rate × Σ nᵢ·s(τᵢ)·Δᵢ / Σ nᵢ

with ``nᵢ`` the reply's ``weighted_by_key`` metric. A stale update therefore moves the
model less, and a straggler only delays its own contribution, never a round.

One "round" of :meth:`FedBuff.start` is one server step, so ``num_rounds`` counts
models produced and the per-round reports, metrics and ``evaluate_fn`` calls line
up with FedAvg's. A node whose message fails or times out is not started again
until the next step, and a step whose every available node has failed closes
early (a step with no usable reply leaves the model unchanged), so a broken node
cannot spin and a run always ends. Optional federated evaluation (``fraction_evaluate`` > 0, off by
default) of each new model runs beside training and lands in
``result.evaluate_metrics_clientapp`` when its replies are in.

``start``'s ``should_stop`` is asked as each step closes, with the step's training and
server metrics; its federated evaluation, which runs beside the next steps, may land
in the result only later. A true answer stops training after that step.

Which replies share a buffer depends on when they arrive, so unlike the synchronous
strategies a FedBuff run is reproducible only as far as its nodes' timing is.

Checkpoints (:mod:`fedcore.strategy.checkpoint`) are taken as each step closes, when
its buffer has just become the new model; a resumed run opens the next step from
that model. The training in flight when the run died is lost, as if those nodes had
failed: the resumed run starts its slots again from the newest model (the arrays
they were sent are not kept), and an evaluation still running beside training when
the checkpoint was taken is not in it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio
import numpy as np
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from fedcore.apps.grid import Grid
from fedcore.domain import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.errors import RefusedReplyError
from fedcore.strategy import arguments
from fedcore.strategy.aggregate import ArrayMean, cast_back, check_same_layout
from fedcore.strategy.fedavg import FedAvg, MetricsAggregation
from fedcore.strategy.protocol import Aggregation
from fedcore.strategy.result import EvaluateFn, Result, RoundReport, StopFn
from fedcore.strategy.rounds import (
    Rounds,
    begin_rounds,
    evaluate_on_server,
    exchange,
    failure_counts,
    log_failures,
    metrics_text,
    push_within,
    refusal,
    replies_within,
    round_limit,
    sampling_seed,
    shuffled,
)
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
        """Train asynchronously until ``num_rounds`` server steps are made (or
        ``should_stop`` ends the run after one); each message has ``round_timeout``
        (:func:`~fedcore.strategy.rounds.round_limit`) for its reply."""
        self._sent.clear()
        limit = round_limit(self, grid, timeout)
        run = _AsyncRun(self, grid, timeout, limit, num_rounds, train_config, evaluate_config)
        return await run.drive(initial_arrays, evaluate_fn, should_stop)


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


@dataclass
class _Lost:
    """Training messages that got no reply within the timeout."""

    message_ids: list[str]


class _Rotation:
    """Which idle node to start next: every online node once, in an order seeded by
    the run's seed, before any node twice. The online list is fetched once per pass,
    so choosing a node costs O(1) however many nodes there are."""

    def __init__(self, grid: Grid, seed: int | None) -> None:
        self._grid = grid
        self._seed = seed
        self._queue: deque[int] = deque()
        self._passes = 0

    async def take(self, count: int, busy: set[int]) -> list[int]:
        chosen: list[int] = []
        refilled = False
        while len(chosen) < count:
            if not self._queue:
                if refilled:
                    break
                self._passes += 1
                online = await self._grid.get_node_ids()
                self._queue.extend(shuffled(online, self._seed, self._passes, "train"))
                refilled = True
                if not self._queue:
                    break
            node_id = self._queue.popleft()
            if node_id not in busy and node_id not in chosen:
                chosen.append(node_id)
        return chosen


@dataclass
class _Step:
    """The open server step: its buffer and what its report will say."""

    buffer: _Buffer
    started: float
    replies: int = 0
    errors: list[Message] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """The labels of the replies the strategy refused (:meth:`FedBuff.check_train_reply`)."""
    missing: int = 0
    benched: set[int] = field(default_factory=set)
    """Nodes that failed during this step: not started again until the next one."""


class _AsyncRun:
    """One :meth:`FedBuff.drive`: the newest model, the nodes at work, the open step."""

    def __init__(
        self,
        strategy: FedBuff,
        grid: Grid,
        timeout: float,
        limit: float,
        num_rounds: int,
        train_config: ConfigRecord,
        evaluate_config: ConfigRecord,
    ) -> None:
        # ``timeout`` bounds each wait for nodes, ``limit`` each message's wait for its reply.
        self.strategy, self.grid, self.timeout, self.limit = strategy, grid, timeout, limit
        self.num_rounds = num_rounds
        self.train_config, self.evaluate_config = train_config, evaluate_config
        self.seed = sampling_seed(grid.run)
        self.rotation = _Rotation(grid, self.seed)
        self.working: dict[str, tuple[int, int]] = {}  # message id -> (node id, round)
        self.sent: dict[str, Message] = {}  # message id -> the message, to check its reply
        self.result = Result()

    async def drive(
        self,
        initial_arrays: ArrayRecord,
        evaluate_fn: EvaluateFn | None,
        should_stop: StopFn | None,
    ) -> Result:
        log.info("%r: %d server steps, sampling seed %s", self.strategy, self.num_rounds, self.seed)
        rounds = await begin_rounds(
            self.strategy,
            self.num_rounds,
            initial_arrays,
            self.train_config,
            self.evaluate_config,
            evaluate_fn,
            should_stop,
        )
        result = self.result = rounds.result
        self.train_config, self.evaluate_config = rounds.train_config, rounds.evaluate_config
        if rounds.first > self.num_rounds:
            return result
        send, outcomes = anyio.create_memory_object_stream[Message | _Lost](math.inf)
        # Leaving the block stops training first, then waits for evaluations still running.
        async with (
            anyio.create_task_group() as evaluations,
            anyio.create_task_group() as training,
            send,
            outcomes,
        ):
            self._training, self._send = training, send
            step = await self._open(rounds.first)
            async for outcome in outcomes:
                self._record(step, outcome)
                if step.replies < self.strategy.buffer_size:
                    await self._top_up(step)
                    if self.working:
                        continue
                    log.warning(
                        "round %d train: every node available failed; closing the step early",
                        step.buffer.server_round,
                    )
                stop = await self._close(step, evaluate_fn, evaluations, rounds)
                await rounds.keep(step.buffer.server_round)
                if stop or step.buffer.server_round == self.num_rounds:
                    training.cancel_scope.cancel()
                    break
                step = await self._open(step.buffer.server_round + 1)
        self.strategy.forget(())
        return result

    def _record(self, step: _Step, outcome: Message | _Lost) -> None:
        if isinstance(outcome, _Lost):
            for message_id in outcome.message_ids:
                node_id, _ = self.working.pop(message_id)
                del self.sent[message_id]
                step.benched.add(node_id)
            step.missing += len(outcome.message_ids)
            return
        node_id, _ = self.working.pop(outcome.metadata.reply_to_message_id)
        sent = self.sent.pop(outcome.metadata.reply_to_message_id)
        if outcome.has_error():
            step.errors.append(outcome)
            step.benched.add(node_id)
        else:
            try:
                outcome = self.strategy.check_train_reply(sent, outcome)
            except RefusedReplyError as exc:
                step.refused.append(refusal(step.buffer.server_round, outcome, exc))
                step.benched.add(node_id)
                return
            step.replies += 1
            step.buffer.add(outcome)

    async def _open(self, server_round: int) -> _Step:
        """Open step ``server_round``: register the newest model and fill the free slots."""
        strategy = self.strategy
        strategy.configure_train(server_round, self.result.arrays, self.train_config, [])
        strategy.forget({*(r for _, r in self.working.values()), server_round})
        step = _Step(strategy.train_aggregation(server_round), self.grid.clock.now())
        await self._top_up(step)
        if not self.working:
            await self.grid.wait_for_nodes(strategy.min_nodes("train"), timeout=self.timeout)
            await self._top_up(step)
        return step

    async def _top_up(self, step: _Step) -> None:
        """Start idle nodes from the newest model until ``concurrency`` are training."""
        free = self.strategy.concurrency - len(self.working)
        if free <= 0:
            return
        skip = step.benched | {node_id for node_id, _ in self.working.values()}
        node_ids = await self.rotation.take(free, skip)
        if not node_ids:
            return
        server_round = step.buffer.server_round
        messages = self.strategy.configure_train(
            server_round, self.result.arrays, ConfigRecord(self.train_config), node_ids
        )
        ids = await push_within(self.grid, messages, self.limit)
        for message_id, node_id, message in zip(ids, node_ids, messages, strict=True):
            self.working[message_id] = (node_id, server_round)
            self.sent[message_id] = message
        self._training.start_soon(self._listen, ids, self._send.clone())

    async def _listen(self, ids: list[str], send: MemoryObjectSendStream[Message | _Lost]) -> None:
        async with send:
            answered = set()
            async for reply in replies_within(self.grid, ids, self.limit):
                answered.add(reply.metadata.reply_to_message_id)
                await send.send(reply)
            lost = [message_id for message_id in ids if message_id not in answered]
            if lost:
                await send.send(_Lost(lost))

    async def _close(
        self, step: _Step, evaluate_fn: EvaluateFn | None, evaluations: TaskGroup, rounds: Rounds
    ) -> bool:
        """Make the step's server update, evaluate, ask ``should_stop`` and report it;
        whether ``should_stop`` ends the run after it. The step's federated evaluation
        runs beside the next steps, so ``should_stop`` sees its metrics only later."""
        server_round, result = step.buffer.server_round, self.result
        arrays, metrics = step.buffer.result()
        if arrays is not None:
            result.arrays = arrays
        if metrics is not None:
            result.train_metrics_clientapp[server_round] = metrics
        if step.errors or step.missing:
            log_failures(server_round, "train", step.errors, step.missing, self.limit)
        if evaluate_fn is not None:
            record = await evaluate_on_server(evaluate_fn, server_round, result.arrays)
            if record is not None:
                result.evaluate_metrics_serverapp[server_round] = record
        if self.strategy.min_nodes("evaluate") > 0:
            evaluations.start_soon(self._evaluate, server_round, result.arrays)
        stop = await rounds.ask_to_stop(server_round)
        report = RoundReport(
            server_round=server_round,
            num_rounds=self.num_rounds,
            train_replies=step.replies,
            evaluate_replies=0,
            elapsed=self.grid.clock.now() - step.started,
            train_failures=failure_counts(step.errors, step.missing, step.refused),
            train_metrics=dict(result.train_metrics_clientapp.get(server_round, {})),
            server_metrics=dict(result.evaluate_metrics_serverapp.get(server_round, {})),
            stopped_early=stop,
        )
        log.info("%s", report.describe(), extra={"fedcore_round": report})
        return stop

    async def _evaluate(self, server_round: int, arrays: ArrayRecord) -> None:
        """Federated evaluation of the model of step ``server_round``, beside training."""
        online = await self.grid.get_node_ids()
        node_ids = shuffled(online, self.seed, server_round, "evaluate")
        messages = self.strategy.configure_evaluate(
            server_round, arrays, ConfigRecord(self.evaluate_config), node_ids
        )
        done = await exchange(
            messages, self.grid, self.limit, server_round, self.num_rounds, "evaluate"
        )
        metrics = self.strategy.aggregate_evaluate(server_round, done.replies)
        if metrics is not None:
            self.result.evaluate_metrics_clientapp[server_round] = metrics
            log.info("round %d evaluation: %s", server_round, metrics_text(metrics))
