"""A real deployment on loopback: a link and three nodes as processes, apps run by ``fedcore run``.

These are the issue's end-to-end checks: quickstart-numpy reaches its accuracy through
the network, and two runs of different apps share one federation at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"
COMPARISON = REPO / "examples" / "strategy-comparison"
PULL_AGAIN = Path(__file__).resolve().parent / "pull_again_app"

pytestmark = pytest.mark.timeout(180)


def _accuracies(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"server accuracy=([0-9.]+)", text)]


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Deployment]:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(3):
            deployment.start_node(f"partition-id={index} num-partitions=3")
        yield deployment


def test_quickstart_numpy_completes_over_the_network_with_its_accuracy(
    federation: Deployment,
) -> None:
    config = "num-server-rounds=10 fraction-train=1.0 fraction-evaluate=1.0"
    done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run \d+ finished:completed", done.stderr)
    accuracies = _accuracies(done.stdout)
    assert len(accuracies) == 10
    assert accuracies[-1] >= 0.70
    listed = json.loads(federation.fedcore("ls", "--json").stdout)
    assert [run["status"] for run in listed] == ["finished:completed"]


def test_the_same_app_directory_runs_under_simulate(tmp_path: Path) -> None:
    with Deployment(tmp_path) as local:
        done = local.fedcore(
            "simulate",
            str(QUICKSTART),
            "--nodes",
            "3",
            "--backend",
            "inline",
            "--run-config",
            "num-server-rounds=10 fraction-train=1.0 fraction-evaluate=1.0",
        )
    assert done.returncode == 0, done.stderr
    assert _accuracies(done.stdout + done.stderr)[-1] >= 0.70


def test_two_runs_of_different_apps_proceed_at_once_and_both_complete(
    federation: Deployment,
) -> None:
    slow = "num-server-rounds=15 fraction-train=1.0 fraction-evaluate=1.0"
    first = federation.fedcore("run", str(QUICKSTART), "--run-config", slow)
    comparison = "num-server-rounds=5 nodes-per-round=3 local-epochs=1"
    second = federation.fedcore("run", str(COMPARISON), "--run-config", comparison)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    run_ids = [first.stdout.strip(), second.stdout.strip()]
    logs = []
    for run_id in run_ids:
        followed = federation.fedcore("log", run_id, "--follow", "--json")
        assert followed.returncode == 0, followed.stderr
        *lines, final = [json.loads(line) for line in followed.stdout.splitlines()]
        assert final["status"] == "finished:completed", final
        logs.append(lines)
    # At once: each run logged while the other was still going.
    (first_start, first_end), (second_start, second_end) = (
        (lines[0]["time"], lines[-1]["time"]) for lines in logs
    )
    assert second_start < first_end
    assert first_start < second_end


def _pulled_again(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"round"')]


def test_pulling_received_ids_again_answers_code_3_in_deployment_as_in_simulation(
    federation: Deployment,
) -> None:
    """A Flower-style loop that pulls ids it already has completes in both runtimes alike."""
    deployed = federation.fedcore("run", str(PULL_AGAIN), "--stream")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    simulated = federation.fedcore(
        "simulate", str(PULL_AGAIN), "--nodes", "3", "--backend", "inline"
    )
    assert simulated.returncode == 0, simulated.stderr
    expected = [{"round": r, "again": [[3, "system"]] * 3} for r in (1, 2)]
    assert _pulled_again(deployed.stdout) == expected
    assert _pulled_again(simulated.stdout + simulated.stderr) == expected
