"""Flower's own example apps under ``fedcore simulate``, unchanged, on both backends.

Each example is extracted from a clone of Flower's repository (tests/flower_apps) and
run as a whole ``fedcore simulate`` process in a temporary directory, which is its
working directory: what it writes (a model, TensorBoard logs, result files) lands
there. Only its data loading is replaced: the processes run in
:func:`~fedcore.testing.flower_examples.offline_environment`, where the stand-ins of
``tests/flower_apps/stand_ins`` answer ``datasets``, ``flwr_datasets`` and
``torchvision.transforms`` with small synthetic data, and W&B is switched off.
Everything else — ``flwr`` answered by fedcore's shim, torch, pandas, TensorBoard,
wandb, xgboost, CatBoost, scikit-learn — is real.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.testing.flower_examples import (
    IRIS_FEATURES,
    advanced_pytorch_best_rounds,
    advanced_pytorch_results,
    flower_example_or_skip,
    iris_histograms,
    logged_histograms,
    offline_environment,
    tensorboard_event_files,
    xgboost_tree_count,
)

TESTS = Path(__file__).resolve().parents[1]
STAND_INS = TESTS / "flower_apps" / "stand_ins"
FEDCORE = Path(sys.executable).parent / "fedcore"
BACKENDS = ["process", "inline"]

# quickstart-pytorch's Net and custom-mods' (the same CNN), as its state_dict names them
CIFAR_NET = {
    "conv1.weight": [6, 3, 5, 5],
    "conv1.bias": [6],
    "conv2.weight": [16, 6, 5, 5],
    "conv2.bias": [16],
    "fc1.weight": [120, 400],
    "fc1.bias": [120],
    "fc2.weight": [84, 120],
    "fc2.bias": [84],
    "fc3.weight": [10, 84],
    "fc3.bias": [10],
}

# advanced-pytorch's Net (Fashion-MNIST)
FASHION_NET = {
    "conv1.weight": [16, 1, 5, 5],
    "conv1.bias": [16],
    "conv2.weight": [32, 16, 5, 5],
    "conv2.bias": [32],
    "fc1.weight": [128, 512],
    "fc1.bias": [128],
    "fc2.weight": [10, 128],
    "fc2.bias": [10],
}

pytestmark = pytest.mark.timeout(120)


def simulate(
    app_dir: Path, *args: str, cwd: Path, fedcore: tuple[str, ...] = (str(FEDCORE),)
) -> subprocess.CompletedProcess[str]:
    """``fedcore simulate APP_DIR --seed 0 ARGS`` in the offline environment; ``fedcore``
    is the command that runs fedcore's CLI."""
    return subprocess.run(
        [*fedcore, "simulate", str(app_dir), "--seed", "0", *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=cwd,
        env=offline_environment(STAND_INS),
        check=False,
    )


def assert_ran_cleanly(done: subprocess.CompletedProcess[str]) -> None:
    """Exit 0, and no traceback anywhere in what the run printed (a worker's or the
    ServerApp's, even one the run survived)."""
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr


def round_metric(log: str, name: str) -> list[float]:
    """Each round's ``NAME=VALUE`` from fedcore's round log lines (``round 2/3: 4
    replies, 0 failures, 0.5 s, evaluate auc=0.9``)."""
    pattern = rf"round \d+/\d+: .*\b{re.escape(name)}=([\d.]+)"
    return [float(value) for value in re.findall(pattern, log)]


def saved_state_dict(path: Path) -> dict[str, list[int]]:
    """The shapes of the state_dict a ServerApp saved with ``torch.save``."""
    import torch

    return {key: list(tensor.shape) for key, tensor in torch.load(path).items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_quickstart_numpy_runs_unchanged(tmp_path: Path, backend: str) -> None:
    app_dir = flower_example_or_skip("quickstart-numpy", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "4", "--backend", backend, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "3 rounds · 24 replies (12 train, 12 evaluate) · 0 failures" in done.stdout
    assert "Saving final model to disk..." in done.stdout
    assert (tmp_path / "final_model.npz").is_file()  # its ServerApp's np.savez, in the cwd


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_quickstart_pytorch_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("torch")
    app_dir = flower_example_or_skip("quickstart-pytorch", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "3", "--backend", backend, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    # Its 3 rounds; every node trains, fraction-evaluate 0.5 of 3 is FedAvg's minimum of 2.
    assert "3 rounds · 15 replies (9 train, 6 evaluate) · 0 failures" in done.stdout
    assert done.stderr.count("server accuracy=") == 3  # its evaluate_fn, after every round
    assert "Saving final model to disk..." in done.stdout
    assert saved_state_dict(tmp_path / "final_model.pt") == CIFAR_NET


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_quickstart_pandas_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("pandas")
    app_dir = flower_example_or_skip("quickstart-pandas", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "3", "--backend", backend, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Received 3/3 results") == 3  # MessageType.QUERY to all 3
    # The three partitions' histograms add up to the whole table's, every round.
    whole = iris_histograms(STAND_INS)
    assert sum(whole[IRIS_FEATURES[0]]) == 150
    assert logged_histograms(done.stderr) == [whole] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_custom_mods_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    app_dir = flower_example_or_skip("custom-mods", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "3", "--backend", backend, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    # fraction-evaluate 0.4 of 3 nodes is FedAvg's minimum of 2.
    assert "3 rounds · 15 replies (9 train, 6 evaluate) · 0 failures" in done.stdout
    # Its TensorBoard mod wrapped every reply: one event file per reply under the run's
    # directory, one directory per node. (What it prints is not counted: two workers'
    # buffered output may interleave mid-line.)
    event_files = tensorboard_event_files(tmp_path)
    assert len(event_files) == 3
    written = [path.read_bytes() for paths in event_files.values() for path in paths]
    assert sum(b"fit_time" in data and b"train_loss" in data for data in written) == 9
    assert sum(b"eval_time" in data and b"eval_acc" in data for data in written) == 6
    assert saved_state_dict(tmp_path / "final_model.pt") == CIFAR_NET


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_advanced_pytorch_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    app_dir = flower_example_or_skip("advanced-pytorch", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "4", "--backend", backend, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    log = done.stderr
    # CustomFedAvg.start, its own loop: the start info, summary() and 10 rounds (its config)
    assert "Starting CustomFedAvg strategy:" in log
    assert "├── rounds: 10" in log  # log_strategy_start_info
    assert "├── fraction_train: 0.25" in log  # self.summary()
    assert log.count("[ROUND ") == 10
    # Its configure_train halves the learning rate at round 5, then calls super()'s.
    assert log.count("Adjusted learning rate to 0.050000") == 1
    assert "Strategy execution finished" in log
    results, config, checkpoints = advanced_pytorch_results(tmp_path / "outputs")
    assert [entry["round"] for entry in results] == list(range(1, 11))
    for entry in results:
        assert set(entry["train_metrics"]) == {"train_loss"}
        assert set(entry["evaluate_metrics_clientapp"]) == {"eval_loss", "eval_acc"}
        assert set(entry["evaluate_metrics_serverapp"]) == {"accuracy", "loss"}
    assert config == {
        "num-server-rounds": 10,
        "fraction-train": 0.25,
        "fraction-evaluate": 0.5,
        "local-epochs": 1,
        "server-device": "cpu",
    }
    assert checkpoints == advanced_pytorch_best_rounds(results)
    assert saved_state_dict(tmp_path / "final_model.pt") == FASHION_NET


# A whole ``fedcore simulate`` of advanced-pytorch with a probe on the engine's one
# hand-off of each message to its node: what the node's Context.state held, as the
# example's ClientApp found it and as it left it. The example's own output says
# nothing about its context.state; this does.
CONTEXT_PROBE = """
import hashlib, json, sys
from fedcore.cli import main
from fedcore.simulation import engine

HEAD = "classification-head"
seen = []
deliver = engine.SimulationEngine._deliver


def digest(context):
    if context is None or HEAD not in context.state:
        return None
    record = context.state[HEAD]
    arrays = dict(zip(record.keys(), record.to_numpy_ndarrays()))
    return hashlib.sha256(b"".join(a.tobytes() for _, a in sorted(arrays.items()))).hexdigest()


async def probed(self, run, node_id, message):
    before = digest(self._contexts.get(node_id))
    await deliver(self, run, node_id, message)
    after = digest(self._contexts.get(node_id))
    seen.append([node_id, message.metadata.message_type, before, after])


engine.SimulationEngine._deliver = probed
try:
    main()
finally:
    with open("context-probe.json", "w") as out:
        json.dump(seen, out)
"""


def test_advanced_pytorchs_classification_head_stays_in_each_nodes_context(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("wandb")
    app_dir = flower_example_or_skip("advanced-pytorch", tmp_path / "flower")

    config = "num-server-rounds=3 fraction-train=1.0"
    done = simulate(
        app_dir, "--nodes", "2", "--backend", "process", "--run-config", config,
        cwd=tmp_path, fedcore=(sys.executable, "-c", CONTEXT_PROBE),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "context-probe.json").read_text())
    by_node: dict[int, list[list[str | None]]] = {}
    for node_id, kind, before, after in seen:
        by_node.setdefault(node_id, []).append([kind, before, after])
    assert len(by_node) == 2
    for deliveries in by_node.values():
        kinds = [kind for kind, _, _ in deliveries]
        assert kinds.count("train") == 3
        assert deliveries[0][1] is None  # a new node's context starts empty
        for (_, _, left), (_, found, _) in itertools.pairwise(deliveries):
            assert found == left  # each message finds the state the last one left
        trained = [after for kind, _, after in deliveries if kind == "train"]
        assert None not in trained
        assert len(set(trained)) == 3  # each round's training wrote a new head


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_quickstart_xgboost_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("xgboost")
    app_dir = flower_example_or_skip("quickstart-xgboost", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "10", "--backend", backend, cwd=tmp_path)

    assert_ran_cleanly(done)
    # fraction-train and fraction-evaluate 0.1 of 10 nodes: FedXgbBagging's minimum of 2.
    assert "3 rounds · 12 replies (6 train, 6 evaluate) · 0 failures" in done.stdout
    aucs = round_metric(done.stderr, "evaluate auc")
    assert len(aucs) == 3
    assert all(0.7 < auc <= 1.0 for auc in aucs), aucs
    assert "Saving final model to disk..." in done.stdout
    # Bagging: each round adds the one tree each of the 2 trained nodes boosted.
    assert xgboost_tree_count(tmp_path / "final_model.json") == 6


# The two runs xgboost-comprehensive's README shows, each with its own strategy.
XGBOOST_COMPREHENSIVE_RUNS = {
    # 5 rounds of FedXgbBagging on every node, evaluated on the server's test split too.
    "bagging": "train-method='bagging' num-server-rounds=5 centralised-eval=true",
    # FedXgbCyclic: one node a round boosts the whole model; linear partition sizes; the
    # nodes evaluate on the test split, enlarged by the example's own resplit.
    "cyclic": "train-method='cyclic' partitioner-type='linear' centralised-eval-client=true",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", list(XGBOOST_COMPREHENSIVE_RUNS))
def test_flowers_xgboost_comprehensive_runs_unchanged(
    tmp_path: Path, method: str, backend: str
) -> None:
    pytest.importorskip("xgboost")
    app_dir = flower_example_or_skip("xgboost-comprehensive", tmp_path / "flower")

    config = XGBOOST_COMPREHENSIVE_RUNS[method]
    done = simulate(
        app_dir, "--nodes", "4", "--backend", backend, "--run-config", config, cwd=tmp_path
    )

    assert_ran_cleanly(done)
    log = done.stderr
    if method == "bagging":
        assert "FedXgbBagging: 5 rounds" in log
        assert "5 rounds · 40 replies (20 train, 20 evaluate) · 0 failures" in done.stdout
        server_aucs = round_metric(log, "server AUC")  # its evaluate_fn, every round
        assert len(server_aucs) == 5
        assert all(0.7 < auc <= 1.0 for auc in server_aucs), server_aucs
        rounds, trees = 5, 5 * 4  # a tree from each of the 4 nodes, every round
    else:
        assert "FedXgbCyclic: 3 rounds" in log
        assert "3 rounds · 6 replies (3 train, 3 evaluate) · 0 failures" in done.stdout
        rounds, trees = 3, 3  # the one trained node boosts the whole model a tree a round
    aucs = round_metric(log, "evaluate auc")
    assert len(aucs) == rounds
    assert all(0.7 < auc <= 1.0 for auc in aucs), aucs
    assert "Saving final model to disk..." in done.stdout
    assert xgboost_tree_count(tmp_path / "final_model.json") == trees


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_quickstart_catboost_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("catboost")
    pytest.importorskip("pandas")
    app_dir = flower_example_or_skip("quickstart-catboost", tmp_path / "flower")

    done = simulate(app_dir, "--nodes", "3", "--backend", backend, cwd=tmp_path)

    assert_ran_cleanly(done)
    log = done.stderr
    # Its own loop: 5 rounds (its config) of send_and_receive to every node, each
    # reply's trees summed into the global model it sends back, serialised, the next
    # round: past 1 MiB of JSON bytes in a ConfigRecord by round 5.
    assert [int(n) for n in re.findall(r"Starting round (\d+)/5", log)] == [1, 2, 3, 4, 5]
    assert log.count("Sampled 3 nodes (out of 3)") == 5
    assert log.count("Received 3/3 results") == 5
    assert "as an error" not in log  # no reply without content
    aucs = [float(auc) for auc in re.findall(r"Avg eval AUC: ([\d.]+)", log)]
    assert len(aucs) == 5
    assert all(0.7 < auc <= 1.0 for auc in aucs), aucs


@pytest.mark.parametrize("backend", BACKENDS)
def test_flowers_vertical_fl_runs_unchanged(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    app_dir = flower_example_or_skip("vertical-fl", tmp_path / "flower")

    # Its 3 feature splits need 3 nodes; 50 of its 250 rounds (it evaluates every 25).
    done = simulate(
        app_dir, "--nodes", "3", "--backend", backend,
        "--run-config", "num-server-rounds=50", cwd=tmp_path,
    )  # fmt: skip

    assert_ran_cleanly(done)
    log = done.stderr
    # Every round: a query for each node's embeddings, then the gradients pushed to
    # each node with no reply awaited (the last round's too, as its main returns).
    assert log.count("--- ServerApp Round ") == 50
    assert log.count("Received 3/3 results") == 50
    assert log.count("Sending gradients to 3 nodes...") == 50
    results = re.findall(r"Round (\d+) -> Loss: ([\d.]+) \| Accuracy: ([\d.]+)%", log)
    assert [int(round_) for round_, _, _ in results] == [25, 50]
    [(_, first_loss, _), (_, last_loss, last_accuracy)] = results
    # The head learns only if each node's model, trained by the pushed gradients, stays
    # in its context.state between rounds. Always guessing "died" (the stand-in's
    # majority, 61.6 % of its rows) is a loss of 0.666.
    assert float(last_loss) < min(float(first_loss), 0.63)
    assert float(last_accuracy) > 62.0
