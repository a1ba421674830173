"""The run record both runtimes enter around ``main``: who hears the rounds, the last
round, the checkpoints, and how a simulated run's record ends."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedcore.domain import RecordDict
from fedcore.results.checkpoint import CHECKPOINT_FILE
from fedcore.results.directory import RUN_FILE
from fedcore.results.run_record import RunRecord, results_record
from fedcore.strategy.checkpoint import Checkpoint, active_checkpoints
from fedcore.strategy.result import RoundReport
from fedcore.testing.clock import FakeClock

pytestmark = pytest.mark.anyio

ROUNDS = logging.getLogger("fedcore.strategy")


def report(server_round: int, *, trained: int = 1, failed: int = 0) -> RoundReport:
    return RoundReport(
        server_round=server_round,
        num_rounds=3,
        train_replies=trained,
        evaluate_replies=0,
        elapsed=0.1,
        train_failures={"code 2": failed} if failed else {},
    )


def log_round(round_report: RoundReport) -> None:
    ROUNDS.info("%s", round_report.describe(), extra={"fedcore_round": round_report})


class Heard(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        round_report = getattr(record, "fedcore_round", None)
        if isinstance(round_report, RoundReport):
            self.rounds.append(round_report.server_round)


class Store:
    def __init__(self) -> None:
        self.saved: list[RecordDict] = []

    async def save(self, records: RecordDict) -> None:
        self.saved.append(records)


def test_its_hearers_hear_the_rounds_while_it_is_entered_and_it_keeps_the_last() -> None:
    heard = Heard()
    fedcore_logger = logging.getLogger("fedcore")
    saved_level = fedcore_logger.level
    fedcore_logger.setLevel(logging.WARNING)  # round reports are INFO: the record hears them
    try:
        log_round(report(1))
        with RunRecord(heard) as record:
            log_round(report(2))
            log_round(report(3, trained=0, failed=2))
        log_round(report(4))
        assert fedcore_logger.level == logging.WARNING  # put back
    finally:
        fedcore_logger.setLevel(saved_level)
    assert heard.rounds == [2, 3]
    assert record.last is not None
    assert record.last.server_round == 3
    assert record.unfinished() == report(3, trained=0, failed=2).untrained_reason()


def test_a_run_whose_last_round_trained_completes() -> None:
    with RunRecord(Heard()) as record:
        log_round(report(1, trained=0, failed=1))
        log_round(report(2))
    assert record.unfinished() is None


def test_without_hearers_it_leaves_the_loggers_alone() -> None:
    fedcore_logger = logging.getLogger("fedcore")
    saved_level, saved_handlers = fedcore_logger.level, list(logging.getLogger().handlers)
    fedcore_logger.setLevel(logging.WARNING)
    try:
        with RunRecord() as record:
            assert fedcore_logger.level == logging.WARNING
            assert logging.getLogger().handlers == saved_handlers
            log_round(report(1, trained=0, failed=1))
    finally:
        fedcore_logger.setLevel(saved_level)
    assert record.last is None
    assert record.unfinished() is None


def test_checkpoints_are_kept_in_its_store_only_while_the_block_runs() -> None:
    assert active_checkpoints() is None
    with RunRecord() as record, record.checkpointing():
        assert active_checkpoints() is None  # no store: none kept
    resume_from = Checkpoint.__new__(Checkpoint)
    with RunRecord(store=Store(), resume_from=resume_from) as record:
        assert record.resume_from is resume_from
        with record.checkpointing(nodes=dict):
            assert active_checkpoints() is not None
        assert active_checkpoints() is None


async def fail_in_record(out: Path, error: Exception, paths: list[Path]) -> None:
    clock = FakeClock(1_700_000_000.0)
    description = {"app": "demo", "seed": 7, "config": {}}
    async with results_record(
        description, out=out, resumption=None, trackers=[], clock=clock, started=clock.now()
    ) as record:
        assert record.path is not None
        paths.append(record.path)
        (record.path / CHECKPOINT_FILE).write_bytes(b"a round's checkpoint")
        log_round(report(1))
        raise error


async def test_a_simulated_run_that_raises_ends_its_directory_failed_and_says_where(
    tmp_path: Path,
) -> None:
    error = RuntimeError("the ServerApp broke")
    paths: list[Path] = []
    with pytest.raises(RuntimeError) as raised:
        await fail_in_record(tmp_path, error, paths)
    assert raised.value is error
    [path] = paths
    assert path.parent == tmp_path
    run = json.loads((path / RUN_FILE).read_text())
    assert run["status"] == "failed"
    assert run["error"] == "RuntimeError: the ServerApp broke"
    assert error.__notes__ == [
        f"results: {path} (go on from its last finished round: fedcore simulate --resume {path})"
    ]


async def test_a_simulated_run_that_returns_completes_and_drops_its_checkpoint(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1_700_000_000.0)
    async with results_record(
        {"app": "demo", "seed": 7}, out=tmp_path, resumption=None, trackers=[], clock=clock,
        started=clock.now(),
    ) as record:  # fmt: skip
        assert record.path is not None
        (record.path / CHECKPOINT_FILE).write_bytes(b"a round's checkpoint")
        log_round(report(1))
        await record.complete(None, clock.now())
    assert json.loads((record.path / RUN_FILE).read_text())["status"] == "completed"
    assert not (record.path / CHECKPOINT_FILE).exists()


async def test_without_a_directory_nothing_is_written(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    async with results_record(
        {"app": "demo", "seed": 7}, out=None, resumption=None, trackers=[], clock=clock,
        started=clock.now(),
    ) as record:  # fmt: skip
        assert record.path is None
        with record.checkpointing():
            assert active_checkpoints() is None
        await record.complete(None, clock.now())
