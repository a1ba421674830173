"""Flower 1.43's additions to ``Strategy.start``, in simulation: ``should_stop`` (early
stopping) with every strategy, in the results directory and across a resume; and a
zero-round run, whose result holds the initial arrays.

The deployed side (the same app under ``fedcore run``) is
``tests/deployment/test_flower_next.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedcore as fc
import fedcore.strategy
from fedcore.strategy import (
    Bulyan,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedBuff,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    QFedAvg,
    Result,
    Strategy,
)
from fedcore.testing import round_reports

pytestmark = pytest.mark.anyio

NODES = 5
W0 = fc.ArrayRecord({"w": np.zeros(3)})


def _client(trained: list[int] | None = None) -> fc.ClientApp:
    """Each node moves the model towards its partition, a step a round; ``trained``
    counts the training messages served."""
    client = fc.ClientApp()

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        if trained is not None:
            trained.append(int(msg.content["config"].get("server-round", 0)))  # type: ignore[arg-type]
        partition = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        w = np.asarray(msg.content["arrays"]["w"]) + 0.1 * (partition + 1)
        metrics = fc.MetricRecord({"num-examples": partition + 1, "train_loss": 1.0 / (1 + w[0])})
        content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "metrics": metrics})
        return fc.Message(content, reply_to=msg)

    @client.evaluate()
    def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
        loss = float(np.mean(np.asarray(msg.content["arrays"]["w"]) - 1.0) ** 2)
        metrics = fc.MetricRecord({"num-examples": 1, "loss": loss})
        return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)

    return client


def _app(make: Callable[[], Strategy], client: fc.ClientApp, **start: Any) -> fc.App:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        return await make().start(grid=grid, initial_arrays=W0, **start)

    return fc.App(server=server, client=client)


async def _simulate(app: fc.App, **options: Any) -> Result:
    done = await fc.simulate(app, nodes=NODES, seed=3, backend="inline", progress=False, **options)
    result: Result = done.value
    return result


STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "FedAvg": FedAvg,
    "FedAvgM": lambda: FedAvgM(server_momentum=0.5),
    "FedProx": lambda: FedProx(proximal_mu=0.1),
    "FedAdam": FedAdam,
    "FedYogi": FedYogi,
    "FedAdagrad": FedAdagrad,
    "FedMedian": FedMedian,
    "FedTrimmedAvg": FedTrimmedAvg,
    "Krum": Krum,
    "MultiKrum": lambda: MultiKrum(num_nodes_to_select=3),
    "Bulyan": Bulyan,
    "QFedAvg": lambda: QFedAvg(client_learning_rate=0.1),
    "DP fixed clipping": lambda: DifferentialPrivacyServerSideFixedClipping(
        FedAvg(), 0.1, clipping_norm=10.0, num_sampled_clients=NODES, seed=1
    ),
    "DP adaptive clipping": lambda: DifferentialPrivacyServerSideAdaptiveClipping(
        FedAvg(), 0.1, num_sampled_clients=NODES, seed=1
    ),
    "FedBuff": lambda: FedBuff(buffer_size=2, concurrency=3),
}


def test_every_strategy_but_fedbuff_runs_the_one_round_driver() -> None:
    """Why the strategies below stand for every one: ``should_stop`` lives in the round
    driver and FedBuff's schedule, the only ``drive`` of its own. A strategy that gets
    another must be added there (and here)."""
    own_drive = {
        name
        for name in fedcore.strategy.__all__
        if isinstance(cls := getattr(fedcore.strategy, name), type)
        and issubclass(cls, Strategy)
        and cls.drive is not Strategy.drive
    }
    assert own_drive == {"FedBuff"}


@pytest.mark.parametrize("make", list(STRATEGIES.values()), ids=list(STRATEGIES))
async def test_should_stop_ends_the_run_after_the_round_it_says(
    make: Callable[[], Strategy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore")
    asked: list[tuple[int, list[int]]] = []

    def should_stop(server_round: int, result: Result) -> bool:
        asked.append((server_round, sorted(result.train_metrics_clientapp)))
        return server_round == 3

    result = await _simulate(_app(make, _client(), num_rounds=6, should_stop=should_stop))
    assert asked == [(1, [1]), (2, [1, 2]), (3, [1, 2, 3])]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    reports = round_reports(caplog.records)
    assert [(r.server_round, r.stopped_early) for r in reports] == [
        (1, False),
        (2, False),
        (3, True),
    ]
    assert "should_stop ends the run after round 3 of 6" in caplog.text
    assert not np.array_equal(result.arrays["w"], W0["w"])


@pytest.mark.parametrize("sync_main", [False, True], ids=["async main", "sync main"])
async def test_should_stop_sees_the_result_so_far_and_may_be_a_coroutine(
    sync_main: bool,
) -> None:
    seen: list[tuple[int, list[float]]] = []

    async def should_stop(server_round: int, result: Result) -> bool:
        seen.append((server_round, result.arrays["w"].tolist()))
        return server_round == 2

    options = {"num_rounds": 5, "should_stop": should_stop}
    server = fc.ServerApp()
    if sync_main:

        @server.main()
        def main(grid: fc.SyncGrid, context: fc.Context) -> Result:
            return FedAvg().start(grid, W0, **options)  # type: ignore[arg-type]

    else:

        @server.main()
        async def amain(grid: fc.Grid, context: fc.Context) -> Result:
            return await FedAvg().start(grid, W0, **options)  # type: ignore[arg-type]

    result = await _simulate(fc.App(server=server, client=_client()))
    # FedAvg of steps 0.1 × (p + 1) weighted by p + 1, p = 0..4: 0.1 × 55 / 15 a round.
    step = 0.1 * 55 / 15
    assert [r for r, _ in seen] == [1, 2]
    for server_round, w in seen:
        np.testing.assert_allclose(w, [step * server_round] * 3)
    np.testing.assert_array_equal(result.arrays["w"], seen[-1][1])


async def test_should_stop_is_asked_after_the_last_round_too_without_stopping_early(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As Flower asks it; true after the last round is no early stop."""
    caplog.set_level(logging.INFO, logger="fedcore")
    asked: list[int] = []

    def should_stop(server_round: int, result: Result) -> bool:
        asked.append(server_round)
        return server_round == 3

    result = await _simulate(_app(FedAvg, _client(), num_rounds=3, should_stop=should_stop))
    assert asked == [1, 2, 3]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert not any(report.stopped_early for report in round_reports(caplog.records))


async def test_should_stop_must_be_callable() -> None:
    app = _app(FedAvg, _client(), num_rounds=2, should_stop=True)
    with pytest.raises(TypeError, match="should_stop must be a callable"):
        await _simulate(app)


@pytest.mark.parametrize("make", [FedAvg, STRATEGIES["FedBuff"]], ids=["FedAvg", "FedBuff"])
async def test_a_zero_round_run_returns_the_initial_arrays(make: Callable[[], Strategy]) -> None:
    """Flower 1.43's ``Result(arrays=initial_arrays)``: no round runs, no node trains, the
    server evaluates the initial arrays once (round 0), should_stop is never asked."""
    trained: list[int] = []
    evaluated: list[int] = []
    asked: list[int] = []

    def evaluate_fn(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
        evaluated.append(server_round)
        return fc.MetricRecord({"w0": float(arrays["w"][0])})

    def should_stop(server_round: int, result: Result) -> bool:
        asked.append(server_round)
        return False

    app = _app(make, _client(trained), num_rounds=0, evaluate_fn=evaluate_fn,
               should_stop=should_stop)  # fmt: skip
    result = await _simulate(app)
    assert result.arrays == W0
    assert (trained, evaluated, asked) == ([], [0], [])
    assert result.train_metrics_clientapp == result.evaluate_metrics_clientapp == {}
    assert list(result.evaluate_metrics_serverapp) == [0]


def _only_run(parent: Path) -> Path:
    (run_dir,) = parent.iterdir()
    return run_dir


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "round" in row]


def _model(run_dir: Path) -> np.ndarray:
    with np.load(run_dir / "model.npz") as saved:
        return np.asarray(saved["w"])


class _Stops:
    """A run that ``should_stop`` ends after round 6 of 8 (its server-side distance to
    the nodes' mean under a bound), and
    that can be made to die once: inside round ``die_in`` (before its checkpoint), or
    after ``start`` returned (``die_in="after"``)."""

    def __init__(self, die_in: int | str | None = None) -> None:
        self.die_in = die_in
        self.asked: list[int] = []
        self.trained: list[int] = []

    def app(self) -> fc.App:
        server = fc.ServerApp()

        def evaluate_fn(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
            if server_round == self.die_in:
                self.die_in = None
                raise RuntimeError(f"the machine died in round {server_round}")
            return fc.MetricRecord({"distance": float(abs(1.5 - arrays["w"][0]))})

        def should_stop(server_round: int, result: Result) -> bool:
            self.asked.append(server_round)
            return result.evaluate_metrics_serverapp[server_round]["distance"] < 0.2  # type: ignore[operator]

        @server.main()
        async def main(grid: fc.Grid, context: fc.Context) -> Result:
            strategy = FedAdam(eta=0.3, fraction_train=0.6)  # server moments: state to resume
            result = await strategy.start(grid, W0, num_rounds=8, evaluate_fn=evaluate_fn,
                                          should_stop=should_stop)  # fmt: skip
            if self.die_in == "after":
                self.die_in = None
                raise RuntimeError("the machine died after start returned")
            return result

        return fc.App(server=server, client=_client(self.trained))


async def test_an_early_stop_is_in_the_results_directory(tmp_path: Path) -> None:
    stops = _Stops()
    result = await _simulate(stops.app(), out=tmp_path)
    run_dir = _only_run(tmp_path)
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["stopped_early_after_round"]) == ("completed", 6)
    rows = _rows(run_dir)
    assert [row["round"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [row.get("stopped_early", False) for row in rows] == [False] * 5 + [True]
    assert all(row["num_rounds"] == 8 for row in rows)
    np.testing.assert_array_equal(_model(run_dir), result.arrays["w"])
    assert stops.asked == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("die_in", [3, "after"], ids=["killed in round 3", "killed after the stop"])
async def test_a_resumed_run_stops_where_the_uninterrupted_one_did(
    die_in: int | str, tmp_path: Path
) -> None:
    """Killed in round 3, the run goes on after round 2 and ``should_stop`` ends it after
    round 6 again; killed once the stop was checkpointed, the resumed run runs no round
    and asks nothing. Either way: the uninterrupted run's model, bit for bit, every
    round recorded once, and the record says where it stopped."""
    whole = await _simulate(_Stops().app(), out=tmp_path / "whole")

    stops = _Stops(die_in)
    with pytest.raises(RuntimeError, match="the machine died"):
        await _simulate(stops.app(), out=tmp_path / "killed")
    run_dir = _only_run(tmp_path / "killed")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    asked_before, trained_before = len(stops.asked), len(stops.trained)

    resumed = await fc.simulate(stops.app(), resume=run_dir, backend="inline", progress=False)
    np.testing.assert_array_equal(resumed.value.arrays["w"], whole.arrays["w"])
    np.testing.assert_array_equal(_model(run_dir), whole.arrays["w"])
    assert resumed.value.evaluate_metrics_serverapp == whole.evaluate_metrics_serverapp
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["stopped_early_after_round"]) == ("completed", 6)
    assert [r["after_round"] for r in record["resumed"]] == [2 if die_in == 3 else 6]
    assert [row["round"] for row in _rows(run_dir)] == [1, 2, 3, 4, 5, 6]
    if die_in == "after":
        assert (len(stops.asked), len(stops.trained)) == (asked_before, trained_before)
    else:
        assert stops.asked[asked_before:] == [3, 4, 5, 6]
