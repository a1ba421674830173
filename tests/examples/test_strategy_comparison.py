"""Every strategy learns the digits (issue 4's bar), and the comparison example's race runs."""

from __future__ import annotations

import importlib
import inspect
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fedcore as fc
import fedcore.strategy
from fedcore.apps.loading import load_app
from fedcore.mods import fixedclipping_mod
from fedcore.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    FedAvg,
    FedXgbBagging,
    FedXgbCyclic,
    Strategy,
)
from fedcore.testing import round_reports

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "strategy-comparison"
ROUNDS = 10
LEARNERS = {"fedavg", "fedprox", "fedadam", "fedbuff"}
"""The strategies that must reach 0.70 in ten rounds, not merely hold their ground."""

pytestmark = pytest.mark.anyio


def _module(name: str) -> ModuleType:
    load_app(EXAMPLE)  # puts the app directory on sys.path
    return importlib.import_module(f"strategy_comparison.{name}")


def _start_accuracy() -> float:
    task = _module("task")
    _, _, x_test, y_test = task.dataset()
    return float(task.evaluate(task.initial_model(), x_test, y_test)[1])


async def _accuracies(
    app: fc.App | Path, caplog: pytest.LogCaptureFixture, **config: object
) -> list[float]:
    with caplog.at_level(logging.INFO, logger="fedcore"):
        await fc.simulate(
            app,
            nodes=30,
            backend="inline",
            seed=0,
            run_config={**config, "num-server-rounds": ROUNDS},
        )
    return [float(r.server_metrics["accuracy"]) for r in round_reports(caplog.records)]


def test_every_exported_strategy_is_in_the_race() -> None:
    """A new strategy must join the example, and so the learning test below."""
    server_app = _module("server_app")
    config = fc.ConfigRecord({"learning-rate": 0.1})
    raced = {type(server_app.build(name, 10, 30, config)) for name in server_app.STRATEGIES}
    exported = {
        value
        for value in vars(fedcore.strategy).values()
        if isinstance(value, type) and issubclass(value, Strategy) and not inspect.isabstract(value)
    }
    # Client-side DP needs the node's mod: tested on its own below. The XGBoost
    # strategies aggregate boosters' bytes, not this model's arrays (tests/strategy).
    assert exported - raced == {
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyClientSideAdaptiveClipping,
        FedXgbBagging,
        FedXgbCyclic,
    }
    assert set(server_app.STRATEGIES) >= LEARNERS


@pytest.mark.parametrize("strategy", _module("server_app").STRATEGIES)
async def test_every_strategy_improves_or_holds_the_digits_model(
    strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    accuracies = await _accuracies(EXAMPLE, caplog, strategy=strategy)
    assert len(accuracies) == ROUNDS
    assert accuracies[-1] >= 0.96 * _start_accuracy()
    if strategy in LEARNERS:
        assert accuracies[-1] > 0.70


async def test_client_side_differential_privacy_learns(caplog: pytest.LogCaptureFixture) -> None:
    """The node half of client-side clipping is a mod; the server adds the noise."""
    handlers, server_module = _module("client_app"), _module("server_app")
    client = fc.ClientApp(mods=[fixedclipping_mod])
    client.train()(handlers.train)
    client.evaluate()(handlers.evaluate)
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        task = _module("task")
        per_round = context.run_config["nodes-per-round"]
        strategy = DifferentialPrivacyClientSideFixedClipping(
            FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=per_round),
            noise_multiplier=0.01,
            clipping_norm=5.0,
            num_sampled_clients=15,
        )
        await strategy.start(
            grid=grid,
            initial_arrays=fc.ArrayRecord(task.initial_model()),
            num_rounds=context.run_config["num-server-rounds"],
            evaluate_fn=server_module.evaluate_on_server,
        )

    declared = load_app(EXAMPLE).config or {}
    accuracies = await _accuracies(fc.App(server, client), caplog, **declared)
    assert len(accuracies) == ROUNDS
    assert accuracies[-1] > 0.70


def test_the_race_records_each_round_with_its_time() -> None:
    """compare.py's race with its slow nodes (timings are the benchmark's business)."""
    load_app(EXAMPLE)
    race = importlib.import_module("compare").race
    for strategy in ("fedavg", "fedbuff"):
        run = race(strategy, nodes=20, rounds=3)
        assert run.strategy == strategy
        assert [point.server_round for point in run.curve] == [1, 2, 3]
        times = [point.seconds for point in run.curve]
        assert times == sorted(times)
        assert 0 < times[-1] <= run.seconds
        assert run.reached(0.0) == run.curve[0]
        assert run.reached(1.01) is None


def test_the_documented_compare_command_prints_one_row_per_strategy() -> None:
    """`python examples/strategy-comparison/compare.py` as the README runs it, from the
    repository's root, made small with the script's own --nodes and --rounds."""
    root = EXAMPLE.parents[1]
    small = ["--nodes", "20", "--rounds", "2", "--target", "0.0"]
    done = subprocess.run(
        [sys.executable, "examples/strategy-comparison/compare.py", "fedavg", "fedbuff", *small],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:2] == ["strategy", "final"]
    assert [row.split()[0] for row in rows] == ["fedavg", "fedbuff"]
    for row in rows:
        _, final, at_round, at_seconds, total = row.split()
        assert 0.0 <= float(final) <= 1.0
        assert at_round == "1"
        assert 0 < float(at_seconds) <= float(total)
