"""Flower's own example apps under ``fedcore run``, unchanged, on a link with two nodes.

As in tests/cli/test_simulate_flower_examples.py, each example comes from a clone of
Flower's repository and only its data loading is replaced: the link and the nodes run
in :func:`~fedcore.testing.flower_examples.offline_environment`, and pass its
``PYTHONPATH`` (which an app process always gets) and ``WANDB_MODE`` (``--app-env``,
as an operator passes a variable on purpose) to the ServerApp and ClientApp processes
they start. A ServerApp process works in the link's directory, the deployment's root,
so what it writes lands there; so does what the ClientApp processes write.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment
from fedcore.testing.flower_examples import (
    OFFLINE_VARIABLES,
    advanced_pytorch_best_rounds,
    advanced_pytorch_results,
    flower_example_or_skip,
    iris_histograms,
    logged_histograms,
    offline_environment,
    tensorboard_event_files,
)

STAND_INS = Path(__file__).resolve().parents[1] / "flower_apps" / "stand_ins"
APP_ENV = [flag for name in OFFLINE_VARIABLES for flag in ("--app-env", name)]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    """A link and two nodes (partitions 0 and 1 of 2), in the offline environment."""
    for name, value in offline_environment(STAND_INS).items():
        monkeypatch.setenv(name, value)
    with Deployment(tmp_path / "deployment", heartbeat_interval=1.0) as running:
        running.start_link(*APP_ENV)
        for index in range(2):
            running.start_node(f"partition-id={index} num-partitions=2", *APP_ENV)
        yield running


def run(deployment: Deployment, app_dir: Path) -> str:
    """``fedcore run APP_DIR --stream`` to the end: the run's output, once it completed."""
    done = deployment.fedcore("run", str(app_dir), "--stream", timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run \d+ finished:completed", done.stderr)
    return done.stdout


def test_flowers_quickstart_numpy_runs_as_it_is(deployment: Deployment, tmp_path: Path) -> None:
    app_dir = flower_example_or_skip("quickstart-numpy", tmp_path / "flower")

    output = run(deployment, app_dir)

    assert "Saving final model to disk..." in output
    assert (deployment.root / "final_model.npz").is_file()


def test_flowers_quickstart_pytorch_runs_as_it_is(deployment: Deployment, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    app_dir = flower_example_or_skip("quickstart-pytorch", tmp_path / "flower")

    output = run(deployment, app_dir)

    # 3 rounds, both nodes training and evaluating; its evaluate_fn after each round
    assert len(re.findall(r"round \d/3: 4 replies, 0 failures", output)) == 3
    assert output.count("server accuracy=") == 3
    assert "Saving final model to disk..." in output
    assert (deployment.root / "final_model.pt").is_file()


def test_flowers_quickstart_pandas_runs_as_it_is(deployment: Deployment, tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    app_dir = flower_example_or_skip("quickstart-pandas", tmp_path / "flower")

    output = run(deployment, app_dir)

    assert output.count("Received 2/2 results") == 3
    assert logged_histograms(output) == [iris_histograms(STAND_INS)] * 3


def test_flowers_custom_mods_runs_as_it_is(deployment: Deployment, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    app_dir = flower_example_or_skip("custom-mods", tmp_path / "flower")

    output = run(deployment, app_dir)

    assert len(re.findall(r"round \d/3: 4 replies, 0 failures", output)) == 3
    event_files = tensorboard_event_files(deployment.root)
    assert len(event_files) == 2  # one directory per node
    written = [path.read_bytes() for paths in event_files.values() for path in paths]
    assert sum(b"fit_time" in data and b"train_loss" in data for data in written) == 6
    assert sum(b"eval_time" in data and b"eval_acc" in data for data in written) == 6


def test_flowers_advanced_pytorch_runs_as_it_is(deployment: Deployment, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    app_dir = flower_example_or_skip("advanced-pytorch", tmp_path / "flower")

    output = run(deployment, app_dir)

    assert "├── rounds: 10" in output
    assert output.count("[ROUND ") == 10
    assert output.count("Adjusted learning rate to 0.050000") == 1
    results, _, checkpoints = advanced_pytorch_results(deployment.root / "outputs")
    assert [entry["round"] for entry in results] == list(range(1, 11))
    assert all(
        set(entry["evaluate_metrics_clientapp"]) == {"eval_loss", "eval_acc"} for entry in results
    )
    assert checkpoints == advanced_pytorch_best_rounds(results)
    assert (deployment.root / "final_model.pt").is_file()
