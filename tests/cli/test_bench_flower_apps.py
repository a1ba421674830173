"""The Flower apps of ``make bench-flower`` run on fedcore, as the benchmark starts them.

``benchmarks/flower/`` holds W2, W3 and W4 written against Flower's API; the benchmark
runs them under Flower 1.42 and under ``fedcore simulate``. Flower is not installed
here, so only fedcore's side runs: each app at a tiny size, through the command line
``benchmarks.versus_flower.command`` builds (inline backend, so no workers start),
checked by the final line its ServerApp logs.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.versus_flower import APPS, FINAL, command

ROOT = Path(__file__).resolve().parents[2]
NODES, ROUNDS = 10, 2

pytestmark = pytest.mark.timeout(120)


def final_line(app: str, tmp_path: Path) -> tuple[str, str]:
    """The ``final …`` line of the app's run: (``model`` or ``accuracy``, the value)."""
    sizes = {"num-nodes": NODES, "num-server-rounds": ROUNDS}
    argv = command("inline", APPS / app, Path("unused"), NODES, sizes)
    done = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr
    found = FINAL.findall(done.stdout + done.stderr)
    assert found, done.stderr
    kind, value = found[-1]
    return kind, value


def test_w2_ends_with_the_weighted_mean_of_every_nodes_step(tmp_path: Path) -> None:
    kind, value = final_line("w2", tmp_path)
    weights = [1 + partition % 5 for partition in range(NODES)]
    step = sum(0.001 * (p % 7) * w for p, w in enumerate(weights)) / sum(weights)
    first = float(re.findall(r"[-\d.e]+", value)[0])
    assert kind == "model"
    assert first == pytest.approx(ROUNDS * step, abs=1e-6)


@pytest.mark.parametrize("app", ["w3", "w4"])
def test_the_training_apps_end_with_an_accuracy_above_chance(app: str, tmp_path: Path) -> None:
    kind, value = final_line(app, tmp_path)
    assert kind == "accuracy"
    assert 0.1 < float(value) <= 1.0
