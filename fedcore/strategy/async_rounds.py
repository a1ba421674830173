"""The asynchronous driver: FedBuff's schedule, beside the synchronous one in
:mod:`fedcore.strategy.rounds`.

It keeps ``concurrency`` nodes training at every moment: whenever one answers, another
is started from the newest model, the online nodes taken in turn in an order seeded by
the run's seed. Every ``buffer_size`` replies the step's aggregation (the strategy's
buffer) becomes the next model. One "round" is one server step, so ``num_rounds``
counts models produced and the per-round reports, metrics and ``evaluate_fn`` calls
line up with the synchronous driver's. A node whose message fails, times out or is
refused is not started again until the next step, and a step whose every available
node has failed closes early (a step with no usable reply leaves the model unchanged),
so a broken node cannot spin and a run always ends. Federated evaluation of each new
model (when the strategy's ``min_nodes("evaluate")`` is positive) runs beside training
and lands in ``result.evaluate_metrics_clientapp`` when its replies are in.

``start``'s ``should_stop`` is asked as each step closes, with the step's training and
server metrics; its federated evaluation, which runs beside the next steps, may land
in the result only later. A true answer stops training after that step.

Which replies share a step depends on when they arrive, so a run is reproducible only
as far as its nodes' timing is.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from fedcore.apps.grid import Grid
from fedcore.domain import ArrayRecord, ConfigRecord, Message
from fedcore.errors import RefusedReplyError
from fedcore.strategy.protocol import Aggregation, Strategy
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

log = logging.getLogger("fedcore.strategy")


class BufferedStrategy(Strategy, Protocol):
    """A strategy as the asynchronous driver uses it (FedBuff): besides a
    :class:`~fedcore.strategy.protocol.Strategy`'s members, how many nodes train at once
    and how many replies make a step. The driver opens each step with
    ``configure_train(step, newest arrays, config, [])`` (no node: it registers the model
    the step updates) and takes the step's aggregation from ``train_aggregation``, which
    must give one; ``forget(keep)`` drops what the strategy keeps for the steps not in
    ``keep`` (no reply is due for them any more)."""

    @property
    def concurrency(self) -> int: ...

    @property
    def buffer_size(self) -> int: ...

    def train_aggregation(self, server_round: int) -> Aggregation: ...

    def forget(self, keep: Iterable[int]) -> None: ...


async def run_async_rounds(
    strategy: BufferedStrategy,
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
    ``should_stop`` ends the run after one); see the module docstring. ``timeout``
    bounds each wait for nodes; each message has ``round_timeout``
    (:func:`~fedcore.strategy.rounds.round_limit`) for its reply."""
    limit = round_limit(strategy, grid, timeout)
    run = _AsyncRun(strategy, grid, timeout, limit, num_rounds, train_config, evaluate_config)
    return await run.drive(initial_arrays, evaluate_fn, should_stop)


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

    server_round: int
    buffer: Aggregation
    started: float
    replies: int = 0
    errors: list[Message] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """The labels of the replies the strategy refused (its ``check_train_reply``)."""
    missing: int = 0
    benched: set[int] = field(default_factory=set)
    """Nodes that failed during this step: not started again until the next one."""


class _AsyncRun:
    """One :func:`run_async_rounds`: the newest model, the nodes at work, the open step."""

    def __init__(
        self,
        strategy: BufferedStrategy,
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
                        step.server_round,
                    )
                stop = await self._close(step, evaluate_fn, evaluations, rounds)
                await rounds.keep(step.server_round)
                if stop or step.server_round == self.num_rounds:
                    training.cancel_scope.cancel()
                    break
                step = await self._open(step.server_round + 1)
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
                step.refused.append(refusal(step.server_round, outcome, exc))
                step.benched.add(node_id)
                return
            step.replies += 1
            step.buffer.add(outcome)

    async def _open(self, server_round: int) -> _Step:
        """Open step ``server_round``: register the newest model and fill the free slots."""
        strategy = self.strategy
        strategy.configure_train(server_round, self.result.arrays, self.train_config, [])
        strategy.forget({*(r for _, r in self.working.values()), server_round})
        step = _Step(server_round, strategy.train_aggregation(server_round), self.grid.clock.now())
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
        server_round = step.server_round
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
        server_round, result = step.server_round, self.result
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
