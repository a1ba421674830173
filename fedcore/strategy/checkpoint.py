"""Round checkpoints: what a strategy's rounds leave behind after each one, so that a
run that dies can go on from its last complete round instead of its first.

A runtime that can keep checkpoints — a simulation with a results directory
(:mod:`fedcore.results.checkpoint`) — puts a :class:`RoundCheckpoints` in place with
:func:`checkpointing` around the ServerApp's ``main``. The round driver behind every
strategy's ``start`` (:func:`~fedcore.strategy.rounds.run_rounds`) finds it with
:func:`active_checkpoints`: after each round it hands over a :class:`Checkpoint`, and
at its start it asks for the one to go on from. The ServerApp's code is unchanged: a
resumed run runs ``main`` from its top again (building its model and strategy as
before), and its ``strategy.start(...)`` skips the rounds the checkpoint already holds.

What a checkpoint holds is what the next round needs and nothing the seed already
fixes: the arrays, the strategy's own state (:meth:`~fedcore.strategy.base.Strategy.state`:
server optimizer moments, an adaptive clipping norm), the train and evaluate configs
(a strategy may change them from round to round), the metrics of the rounds so far,
whether ``start``'s ``should_stop`` ended the run after this round (a run resumed from
it then runs no round more), and, from the runtime, every node's ``Context.state``.
The nodes each round samples follow from (seed, round), so the sampling needs no state
of its own. A checkpoint is
a :class:`~fedcore.domain.RecordDict` (:meth:`Checkpoint.to_records`), so whatever
can keep records — a file, the link's artifacts — can keep it.

Only the first ``start`` of a ``main`` is checkpointed: a second one in the same
``main`` (a fine-tuning phase after the first) logs that it is not, and a resumed run
runs it whole again after the first returns from its checkpoint. FedBuff's
asynchronous schedule checkpoints each server step (what is in flight then is lost:
:mod:`fedcore.strategy.async_rounds`). A ``main`` that drives the grid by hand leaves no
checkpoint; resuming such a run says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from fedcore.domain import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.errors import CheckpointError
from fedcore.strategy.protocol import Strategy
from fedcore.strategy.result import Result

log = logging.getLogger("fedcore.strategy")

FORMAT = 1
"""The version of :meth:`Checkpoint.to_records`' layout; another is refused on reading."""

_HEAD, _ARRAYS, _TRAIN_CONFIG, _EVALUATE_CONFIG = (
    "checkpoint",
    "arrays",
    "train-config",
    "evaluate-config",
)
_STRATEGY, _NODE = "strategy:", "node:"
_SCOPES = {
    "train:": "train_metrics_clientapp",
    "evaluate:": "evaluate_metrics_clientapp",
    "server:": "evaluate_metrics_serverapp",
}


@dataclass
class Checkpoint:
    """A run's state after its round ``server_round`` of ``num_rounds``."""

    server_round: int
    num_rounds: int
    strategy: str
    """The class name of the strategy whose rounds these are."""
    result: Result
    """The arrays after ``server_round`` and the metrics of every round up to it."""
    strategy_state: RecordDict
    train_config: ConfigRecord
    evaluate_config: ConfigRecord
    nodes: dict[int, RecordDict] = field(default_factory=dict)
    """Each node's ``Context.state``, by node id: the simulation's; empty in deployment,
    where the link keeps the contexts itself."""
    stopped: bool = False
    """``start``'s ``should_stop`` ended the run after ``server_round``: a resumed run
    runs no round more."""

    def to_records(self) -> RecordDict:
        """The checkpoint as one RecordDict, its records named by what they hold."""
        records = RecordDict(
            {
                _HEAD: ConfigRecord(
                    {
                        "format": FORMAT,
                        "round": self.server_round,
                        "num-rounds": self.num_rounds,
                        "strategy": self.strategy,
                        "stopped": self.stopped,
                    }
                ),
                _ARRAYS: self.result.arrays,
                _TRAIN_CONFIG: self.train_config,
                _EVALUATE_CONFIG: self.evaluate_config,
            }
        )
        for name, record in self.strategy_state.items():
            records[_STRATEGY + name] = record
        for prefix, attribute in _SCOPES.items():
            history: dict[int, MetricRecord] = getattr(self.result, attribute)
            for server_round, metrics in history.items():
                records[f"{prefix}{server_round}"] = metrics
        for node_id, state in self.nodes.items():
            for name, record in state.items():
                records[f"{_NODE}{node_id}:{name}"] = record
        return records

    @classmethod
    def from_records(cls, records: RecordDict) -> Checkpoint:
        """The checkpoint :meth:`to_records` made; :class:`CheckpointError` for anything else."""
        head = records.get(_HEAD)
        arrays = records.get(_ARRAYS)
        if not isinstance(head, ConfigRecord) or not isinstance(arrays, ArrayRecord):
            raise CheckpointError("these records are not a round checkpoint")
        if head.get("format") != FORMAT:
            raise CheckpointError(
                f"a checkpoint of format {head.get('format')!r}; this fedcore reads {FORMAT}"
            )
        server_round, num_rounds, strategy = (
            head.get("round"),
            head.get("num-rounds"),
            head.get("strategy"),
        )
        if not isinstance(server_round, int) or not isinstance(num_rounds, int):
            raise CheckpointError("a checkpoint without its round")
        stopped = head.get("stopped", False)  # absent from checkpoints older than should_stop
        if not isinstance(stopped, bool):
            raise CheckpointError("a checkpoint whose 'stopped' is not a bool")
        checkpoint = cls(
            server_round=server_round,
            num_rounds=num_rounds,
            strategy=str(strategy),
            result=Result(arrays=arrays),
            strategy_state=RecordDict(),
            train_config=_config(records, _TRAIN_CONFIG),
            evaluate_config=_config(records, _EVALUATE_CONFIG),
            stopped=stopped,
        )
        for name, record in records.items():
            if name.startswith(_STRATEGY):
                checkpoint.strategy_state[name.removeprefix(_STRATEGY)] = record
            elif name.startswith(_NODE):
                node, _, state_name = name.removeprefix(_NODE).partition(":")
                checkpoint.nodes.setdefault(_number(node, name), RecordDict())[state_name] = record
            else:
                checkpoint._add_metrics(name, record)
        return checkpoint

    def _add_metrics(self, name: str, record: object) -> None:
        for prefix, attribute in _SCOPES.items():
            if name.startswith(prefix):
                if not isinstance(record, MetricRecord):
                    raise CheckpointError(f"the checkpoint's {name!r} is not a MetricRecord")
                getattr(self.result, attribute)[_number(name.removeprefix(prefix), name)] = record
                return


def _number(text: str, name: str) -> int:
    if not text.isdigit():
        raise CheckpointError(f"the checkpoint's record {name!r} names no round or node")
    return int(text)


def _config(records: RecordDict, name: str) -> ConfigRecord:
    record = records.get(name)
    if not isinstance(record, ConfigRecord):
        raise CheckpointError(f"a checkpoint without its {name}")
    return record


class CheckpointStore(Protocol):
    """Where a run's checkpoints go: each one replaces the one before, whole, so a
    reader finds the last complete one whenever the run died."""

    async def save(self, records: RecordDict) -> None: ...


class RoundCheckpoints:
    """A run's checkpoints: saved to ``store`` after every round of its first ``start``,
    ``resume_from`` (if any) handed to that ``start`` to go on from.

    ``nodes``, where the runtime holds the nodes' contexts, returns each node's
    ``Context.state`` for the checkpoint; it is called between rounds, when no
    ClientApp is at work.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        resume_from: Checkpoint | None = None,
        nodes: Callable[[], Mapping[int, RecordDict]] | None = None,
    ) -> None:
        self._store = store
        self._resume_from = resume_from
        self._nodes = nodes
        self._owner: object = None

    def begin(self, strategy: Strategy, num_rounds: int) -> Checkpoint | None:
        """A ``start`` of ``strategy`` for ``num_rounds`` begins: the checkpoint it goes on
        from, if the run is resumed (it must be the same strategy for as many rounds).

        Only the first ``start`` of the run is checkpointed; a later one is told so in the
        log and gets ``None``.
        """
        if self._owner is not None:
            log.warning(
                "%s.start: the run's checkpoints are those of its first start; this one "
                "is not checkpointed, and a resumed run runs it from its first round",
                type(strategy).__name__,
            )
            return None
        self._owner = strategy
        checkpoint, self._resume_from = self._resume_from, None
        if checkpoint is None:
            return None
        name = type(strategy).__name__
        if (checkpoint.strategy, checkpoint.num_rounds) != (name, num_rounds):
            raise CheckpointError(
                f"the checkpoint is of {checkpoint.strategy} for {checkpoint.num_rounds} "
                f"rounds, but this run starts {name} for {num_rounds}: resume the run "
                "with the app and run config it was started with"
            )
        return checkpoint

    async def save(
        self,
        strategy: Strategy,
        server_round: int,
        num_rounds: int,
        result: Result,
        train_config: ConfigRecord,
        evaluate_config: ConfigRecord,
        *,
        stopped: bool = False,
    ) -> None:
        """Keep the run's state after ``server_round``: in ``store`` once this returns
        (nothing, for a ``start`` other than the first). ``stopped``: ``should_stop``
        ended the run after this round."""
        if strategy is not self._owner:
            return
        checkpoint = Checkpoint(
            server_round=server_round,
            num_rounds=num_rounds,
            strategy=type(strategy).__name__,
            result=result,
            strategy_state=strategy.state(),
            train_config=train_config,
            evaluate_config=evaluate_config,
            nodes=dict(self._nodes()) if self._nodes is not None else {},
            stopped=stopped,
        )
        await self._store.save(checkpoint.to_records())


_active: ContextVar[RoundCheckpoints | None] = ContextVar("fedcore_checkpoints", default=None)


@contextmanager
def checkpointing(checkpoints: RoundCheckpoints) -> Iterator[RoundCheckpoints]:
    """Make ``checkpoints`` the ones the round driver uses while the block runs (the
    ServerApp's ``main`` is called inside it; its threads and tasks inherit it)."""
    token = _active.set(checkpoints)
    try:
        yield checkpoints
    finally:
        _active.reset(token)


def active_checkpoints() -> RoundCheckpoints | None:
    """The run's checkpoints, or ``None`` where the runtime keeps none."""
    return _active.get()
