"""A Flower-style custom strategy runs on fedcore: in simulation and deployed.

``custom_strategy_app`` is written as Flower's advanced-pytorch example writes its
``CustomFedAvg`` — ``configure_train(server_round, arrays, config, grid)`` with a
learning-rate schedule, calling ``super().configure_train(..., grid)``, and a
``start`` of its own driving rounds through the ServerApp's Grid — with fedcore's
imports. Both runtimes go through the same strategy code: the Grid a plain
``def main`` gets. Its model is a vector the test follows by hand: two nodes pull it
towards 1 and 2, so its mean moves towards 1.5 by the round's learning rate.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import fedcore as fc
from fedcore.strategy import Result
from fedcore.testing.deployment import Deployment

APP = Path(__file__).resolve().parent / "custom_strategy_app"

# lr 0.1, then halved at round 2 and kept halved (the schedule changes the config it
# is given, which every round shares)
RATES = [0.1, 0.05, 0.05]


def _expected_w(rounds: int) -> float:
    w = 0.0
    for lr in RATES[:rounds]:
        w = w + lr * (1.5 - w)  # the mean of w + lr (1 − w) and w + lr (2 − w)
    return w


@pytest.mark.anyio
async def test_in_simulation(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fedcore.strategy"):
        result: Result = (await fc.simulate(APP, nodes=2, seed=0, backend="inline")).value

    np.testing.assert_allclose(result.arrays["w"], np.full(3, _expected_w(3)))
    assert [result.train_metrics_clientapp[r]["lr"] for r in (1, 2, 3)] == RATES
    w1 = _expected_w(1)
    loss = ((w1 - 1) ** 2 + (w1 - 2) ** 2) / 2
    assert result.evaluate_metrics_clientapp[1]["loss"] == pytest.approx(loss)
    assert "├── fraction_train: 1.0" in caplog.messages  # its start calls self.summary()


@pytest.mark.timeout(180)
def test_deployed_on_a_link_with_two_nodes(tmp_path: Path) -> None:
    with Deployment(tmp_path) as deployment:
        deployment.start_link()
        deployment.start_node("partition-id=0 num-partitions=2")
        deployment.start_node("partition-id=1 num-partitions=2")
        final, lines = deployment.follow(deployment.submit(APP))

    assert final["status"] == "finished:completed", final
    reports = [line for line in lines if line.startswith("{")]
    assert len(reports) == 3, lines
    last = json.loads(reports[-1])
    np.testing.assert_allclose(last["w"], np.full(3, _expected_w(3)))
    assert [json.loads(report)["train"]["lr"] for report in reports] == RATES
    assert any(line.endswith("fedcore.strategy: ├── fraction_train: 1.0") for line in lines)
