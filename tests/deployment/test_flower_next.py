"""Flower 1.43's additions deployed and simulated alike: ``flower_next_app`` under
``fedcore run`` on a link with three nodes and under ``fedcore simulate`` prints the
same lines — pull any, the deprecated keyword, an early stop after round 2 of 6, a
zero-round start — and both results directories say the run stopped early, and where.

The simulation's side in detail (every strategy, resumes): tests/strategy/test_early_stopping.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedcore.testing.deployment import Deployment, printed_objects

APP = Path(__file__).resolve().parent / "flower_next_app"

pytestmark = pytest.mark.timeout(180)

EXPECTED = [
    {"pulled_any": True, "probes": [0, 1, 2], "again": 0},
    {"deprecated": ["DeprecationWarning"], "named": 1},
    {"rounds": [1, 2], "w": [2.0, 2.0]},
    {"zero_rounds_arrays_are_initial": True, "metrics": 0},
]


def _record(parent: Path) -> tuple[dict[str, object], list[dict[str, object]], np.ndarray]:
    (directory,) = parent.iterdir()
    run = json.loads((directory / "run.json").read_text())
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    rows = [row for row in map(json.loads, lines) if "round" in row]
    with np.load(directory / "model.npz") as model:
        return run, rows, np.asarray(model["w"])


def test_pull_any_early_stop_and_zero_rounds_deployed_as_simulated(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(3):
            deployment.start_node(f"partition-id={index} num-partitions=3")
        deployed = deployment.fedcore(
            "run", str(APP), "--stream", "--out", str(tmp_path / "deployed")
        )
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        simulated = deployment.fedcore(
            "simulate", str(APP), "--nodes", "3", "--backend", "inline",
            "--out", str(tmp_path / "simulated"),
        )  # fmt: skip
        assert simulated.returncode == 0, simulated.stderr
    assert printed_objects(deployed.stdout.splitlines()) == EXPECTED
    assert printed_objects((simulated.stdout + simulated.stderr).splitlines()) == EXPECTED
    for side in ("deployed", "simulated"):
        run, rows, model = _record(tmp_path / side)
        assert (run["status"], run["stopped_early_after_round"]) == ("completed", 2), side
        assert [(row["round"], row.get("stopped_early", False)) for row in rows] == [
            (1, False),
            (2, True),
        ], side
        np.testing.assert_array_equal(model, [2.0, 2.0])
