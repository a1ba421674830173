"""``Strategy.state()`` / ``load_state()``: a strategy rebuilt from its arguments and handed
the state of another after round 1 makes round 2 exactly as that one does; and a round
checkpoint survives its trip through records and bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore.errors import CheckpointError
from fedcore.results.checkpoint import CheckpointFile, read_checkpoint
from fedcore.results.resume import open_resumption
from fedcore.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedYogi,
    Result,
    Strategy,
)
from fedcore.strategy.checkpoint import Checkpoint, RoundCheckpoints
from fedcore.wire import pack_recorddict, pack_recorddict_parts, unpack_recorddict

NODES = [31, 32, 33]
MODEL = ArrayRecord({"w": np.array([0.5, -1.0, 2.0]), "n": np.array([7], dtype=np.int64)})


def _round(strategy: Strategy, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
    """One training round as the round driver runs it, replies fixed by the round."""
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), NODES)
    aggregation = strategy.train_aggregation(server_round)
    assert aggregation is not None
    for index, sent in enumerate(messages):
        sent.metadata.message_id = f"{server_round}.{index}"
        w = np.asarray(arrays["w"]) + np.array([1.0, -0.5, 0.25]) * (index + server_round)
        content = RecordDict(
            {
                "arrays": ArrayRecord({"w": w, "n": np.array([7 + index], dtype=np.int64)}),
                "metrics": MetricRecord({"num-examples": index + 1}),
            }
        )
        aggregation.add(Message(content, reply_to=sent))
    new = aggregation.result()[0]
    assert new is not None
    return new


def _through_bytes(state: RecordDict) -> RecordDict:
    """The state as a checkpoint file gives it back: decoded, arrays read-only views."""
    return unpack_recorddict(pack_recorddict(state))


STATEFUL: dict[str, Callable[[], Strategy]] = {
    "fedadam": lambda: FedAdam(eta=0.2, beta_1=0.8, beta_2=0.9),
    "fedyogi": lambda: FedYogi(beta_1=0.5, beta_2=0.7),
    "fedadagrad": lambda: FedAdagrad(eta=0.4),
    "fedavgm": lambda: FedAvgM(server_learning_rate=0.7, server_momentum=0.9),
    "dp-adaptive-over-fedadam": lambda: DifferentialPrivacyServerSideAdaptiveClipping(
        FedAdam(beta_1=0.9, beta_2=0.99), noise_multiplier=0.1, num_sampled_clients=3, seed=4
    ),
    "dp-fixed-over-fedavgm": lambda: DifferentialPrivacyServerSideFixedClipping(
        FedAvgM(server_momentum=0.5), 0.1, clipping_norm=5.0, num_sampled_clients=3, seed=4
    ),
}


@pytest.mark.parametrize("make", list(STATEFUL.values()), ids=list(STATEFUL))
def test_a_strategy_given_another_s_state_makes_the_same_next_rounds(
    make: Callable[[], Strategy],
) -> None:
    running = make()
    arrays = _round(running, 1, MODEL)
    state = running.state()
    assert state, "a strategy with state between rounds returns some"

    rebuilt = make()
    rebuilt.load_state(_through_bytes(state))
    fresh = make()  # no state: what a resume that lost it would do
    expected, got, lost = arrays, arrays, arrays
    for server_round in (2, 3):
        expected = _round(running, server_round, expected)
        got = _round(rebuilt, server_round, got)
        lost = _round(fresh, server_round, lost)
    np.testing.assert_array_equal(got["w"], expected["w"])
    assert not np.array_equal(lost["w"], expected["w"])


def test_a_strategy_without_state_refuses_one() -> None:
    assert FedAvg().state() == RecordDict()
    FedAvg().load_state(RecordDict())
    with pytest.raises(ValueError, match="FedAvg keeps no state between rounds"):
        FedAvg().load_state(RecordDict({"m_t": ArrayRecord()}))
    with pytest.raises(ValueError, match="FedAdam keeps no state named 'momentum_vector'"):
        FedAdam().load_state(RecordDict({"momentum_vector": ArrayRecord()}))


def _checkpoint(server_round: int = 4) -> Checkpoint:
    result = Result(arrays=MODEL)
    result.train_metrics_clientapp = {1: MetricRecord({"loss": 0.5})}
    result.evaluate_metrics_serverapp = {0: MetricRecord({"acc": 0.1}), 1: MetricRecord()}
    return Checkpoint(
        server_round=server_round,
        num_rounds=12,
        strategy="FedAdam",
        result=result,
        strategy_state=RecordDict({"m_t": ArrayRecord({"w": np.ones(3)})}),
        train_config=ConfigRecord({"lr": 0.05}),
        evaluate_config=ConfigRecord(),
        nodes={7: RecordDict({"a:b": ConfigRecord({"k": 1})}), 9: RecordDict()},
    )


def test_a_checkpoint_survives_records_and_bytes() -> None:
    original = _checkpoint()
    back = Checkpoint.from_records(_through_bytes(original.to_records()))
    assert (back.server_round, back.num_rounds, back.strategy) == (4, 12, "FedAdam")
    assert back.result == original.result
    assert back.strategy_state == original.strategy_state
    assert (back.train_config, back.evaluate_config) == (ConfigRecord({"lr": 0.05}), ConfigRecord())
    # A node with an empty state has nothing to keep; one with a record keeps its name whole.
    assert back.nodes == {7: RecordDict({"a:b": ConfigRecord({"k": 1})})}
    assert back.stopped is False
    original.stopped = True  # should_stop ended the run after this round
    assert Checkpoint.from_records(_through_bytes(original.to_records())).stopped is True


def test_records_that_are_no_checkpoint_are_refused() -> None:
    with pytest.raises(CheckpointError, match="not a round checkpoint"):
        Checkpoint.from_records(RecordDict({"arrays": MODEL}))
    records = _checkpoint().to_records()
    head = records["checkpoint"]
    assert isinstance(head, ConfigRecord)
    head["format"] = 99
    with pytest.raises(CheckpointError, match="format 99"):
        Checkpoint.from_records(records)
    head["format"], head["stopped"] = 1, "yes"
    with pytest.raises(CheckpointError, match="'stopped' is not a bool"):
        Checkpoint.from_records(records)
    del head["stopped"]  # a checkpoint from before should_stop: it did not stop
    assert Checkpoint.from_records(records).stopped is False


class _Kept:
    def __init__(self) -> None:
        self.saved: list[RecordDict] = []

    async def save(self, records: RecordDict) -> None:
        self.saved.append(records)


@pytest.mark.anyio
async def test_only_the_first_start_is_checkpointed_and_a_resume_must_match_it() -> None:
    store = _Kept()
    checkpoints = RoundCheckpoints(store, resume_from=_checkpoint())
    with pytest.raises(CheckpointError, match="FedAdam for 12 rounds, but this run starts FedAvg"):
        checkpoints.begin(FedAvg(), 12)

    checkpoints = RoundCheckpoints(store, resume_from=_checkpoint())
    first, second = FedAdam(), FedAdam()
    assert checkpoints.begin(first, 12) is not None
    assert checkpoints.begin(second, 12) is None  # a second start is not resumed...
    for strategy in (first, second):
        await checkpoints.save(
            strategy, 5, 12, Result(arrays=MODEL), ConfigRecord(), ConfigRecord()
        )
    assert len(store.saved) == 1  # ...nor checkpointed


def test_resuming_drops_the_rounds_after_the_checkpoint(tmp_path: Path) -> None:
    """A run killed after round 5's line but before its checkpoint goes on after round 4:
    the line of round 5 goes, so the round is recorded once."""
    (tmp_path / "run.json").write_text(json.dumps(
        {"app": "a", "seed": 1, "nodes": 2, "config": {}, "status": "running"}
    ))  # fmt: skip
    lines = [{"run": 1}, *({"round": r} for r in range(1, 6))]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"round": 6, "trai'
    (tmp_path / "metrics.jsonl").write_text(text)
    (tmp_path / "checkpoint.bin").write_bytes(pack_recorddict(_checkpoint(4).to_records()))

    resumption = open_resumption(tmp_path)
    assert resumption.checkpoint.server_round == 4
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [{"run": 1}, *({"round": r} for r in range(1, 5))]


@pytest.mark.parametrize(
    ("status", "checkpoint", "message"),
    [
        ("completed", True, "completed: there is nothing to resume"),
        ("running", False, "has no checkpoint"),
    ],
)
def test_what_cannot_be_resumed_says_why(
    tmp_path: Path, status: str, checkpoint: bool, message: str
) -> None:
    (tmp_path / "run.json").write_text(json.dumps(
        {"app": "a", "seed": 1, "nodes": 2, "config": {}, "status": status}
    ))  # fmt: skip
    if checkpoint:
        (tmp_path / "checkpoint.bin").write_bytes(pack_recorddict(_checkpoint().to_records()))
    with pytest.raises(ValueError, match=message):
        open_resumption(tmp_path)
    (tmp_path / "checkpoint.bin").write_bytes(b"not a checkpoint")
    if status == "running":
        with pytest.raises(CheckpointError, match="is damaged"):
            open_resumption(tmp_path)


@pytest.mark.anyio
async def test_a_checkpoint_write_that_fails_midway_leaves_the_last_one_whole(
    tmp_path: Path,
) -> None:
    """What the README says of a kill mid-write: the new checkpoint goes beside the old
    one and over it only once complete, so a write that stops leaves the old one."""
    store = CheckpointFile(tmp_path)
    await store.save(_checkpoint(4).to_records())
    parts = pack_recorddict_parts(_checkpoint(5).to_records())
    with pytest.raises(TypeError):
        store._write([*parts[:1], "the write stops here", *parts[1:]])  # type: ignore[list-item]
    assert read_checkpoint(tmp_path).server_round == 4
    await store.save(_checkpoint(5).to_records())
    assert read_checkpoint(tmp_path).server_round == 5
