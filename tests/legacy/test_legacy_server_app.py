"""A legacy app directory under ``fedcore simulate``, as whole processes, on both backends.

The app (``tests/apps/legacy_style``) is written with Flower's legacy API throughout:
``ServerApp(server_fn=...)`` returning ``ServerAppComponents(strategy=FedAvg(...),
config=ServerConfig(num_rounds=3))``, and a ``NumPyClient`` in ``ClientApp(client_fn=...)``;
its ``workflow_app`` drives the same strategy from a Message-API ``main`` with
``LegacyContext`` and ``DefaultWorkflow``. Each fit adds 1 to a model of three zeros,
so round r's distributed loss (the model's sum) is 3r.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LEGACY_STYLE = Path(__file__).resolve().parents[1] / "apps" / "legacy_style"
FEDCORE = Path(sys.executable).parent / "fedcore"
LOSSES = [[1, 3.0], [2, 6.0], [3, 9.0]]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def app_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(LEGACY_STYLE, tmp_path / "legacy-style"))


def simulate(app_dir: Path, backend: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    flags = ["--nodes", "4", "--backend", backend, "--seed", "0", "--out", "results"]
    done = subprocess.run(
        [str(FEDCORE), "simulate", str(app_dir), *flags],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def run_directory(cwd: Path) -> Path:
    [found] = (cwd / "results").iterdir()
    return found


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_server_fn_app_runs_its_rounds_and_fills_the_history(
    app_copy: Path, tmp_path: Path, backend: str
) -> None:
    done = simulate(app_copy, backend, tmp_path)

    log = done.stderr
    assert "Starting Flower ServerApp, config: num_rounds=3, no round_timeout" in log
    for server_round in (1, 2, 3):
        assert f"[ROUND {server_round}]" in log
    assert log.count("configure_fit: strategy sampled 4 clients (out of 4)") == 3
    assert log.count("aggregate_evaluate: received 4 results and 0 failures") == 3
    # The [SUMMARY]: History's losses_distributed, one line per round.
    summary = log[log.index("[SUMMARY]") :]
    assert "Run finished 3 round(s)" in summary
    assert "History (loss, distributed):" in summary
    for server_round, loss in LOSSES:
        assert f"round {server_round}: {loss}" in summary
    # Each round is in the results directory too, as fedcore's strategies' are.
    lines = (run_directory(tmp_path) / "metrics.jsonl").read_text().splitlines()
    rounds = [json.loads(line) for line in lines[1:]]
    assert [(row["round"], row["evaluate"]["loss"]) for row in rounds] == [
        tuple(pair) for pair in LOSSES
    ]
    assert [row["replies"] for row in rounds] == [8, 8, 8]  # 4 fit, 4 evaluate
    assert json.loads((run_directory(tmp_path) / "run.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_legacy_context_and_default_workflow_in_a_message_api_main(
    app_copy: Path, tmp_path: Path, backend: str
) -> None:
    pyproject = app_copy / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace("legacy_style.server_app", "legacy_style.workflow_app"))

    done = simulate(app_copy, backend, tmp_path)

    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert json.loads(line) == {"losses_distributed": LOSSES}
    assert done.stderr.count("configure_evaluate: strategy sampled 4 clients (out of 4)") == 3
    assert "History (loss, distributed):" in done.stderr
    lines = (run_directory(tmp_path) / "metrics.jsonl").read_text().splitlines()
    rounds = [json.loads(line) for line in lines[1:]]
    assert [(row["round"], row["evaluate"]["loss"]) for row in rounds] == [
        tuple(pair) for pair in LOSSES
    ]
