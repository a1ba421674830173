"""A legacy NumPyClient app under a Message-API ServerApp (fedcore's FedAvg), run as a
whole ``fedcore simulate`` process on both backends, and with ``fedcore run`` on a link
with two nodes (which load its ``ClientApp(client_fn=...)`` as any other).

The app directory is written here, as a Flower user writes one: ``import flwr``
throughout, ``ClientApp(client_fn=client_fn)`` returning a ``NumPyClient``. Each of the
4 nodes adds ``partition-id + 1`` to the model and reports as many examples, so FedAvg
moves it by (1 + 4 + 9 + 16) / 10 = 3 a round: 9 after 3 rounds, only if every
client's arrays and weights went through both translations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.deployment import Deployment, printed_objects

FEDCORE = Path(sys.executable).parent / "fedcore"

pytestmark = pytest.mark.timeout(180)

PYPROJECT = """\
[project]
name = "legacy-numpy"
version = "1.0.0"
dependencies = ["flwr[simulation]>=1.20", "numpy"]

[tool.flwr.app]
publisher = "fedcore-tests"

[tool.flwr.app.components]
serverapp = "legacy_numpy.server_app:app"
clientapp = "legacy_numpy.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
"""

CLIENT_APP = """\
import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context


class FlowerClient(NumPyClient):
    def __init__(self, step):
        self.step = step

    def fit(self, parameters, config):
        assert config["lr"] == 0.1
        return [p + self.step for p in parameters], self.step, {"step": self.step, "who": "np"}

    def evaluate(self, parameters, config):
        return float(parameters[0].sum()), 1, {"accuracy": 0.5}


def client_fn(context: Context):
    return FlowerClient(int(context.node_config["partition-id"]) + 1).to_client()


app = ClientApp(client_fn=client_fn)
"""

OLDER_CLIENT_FN = """\
def client_fn(cid: str):
    return FlowerClient(int(cid) + 1).to_client()
"""

SERVER_APP = """\
import json

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({"w": np.zeros(2)}),
        train_config=ConfigRecord({"lr": 0.1}),
        num_rounds=context.run_config["num-server-rounds"],
    )
    last = max(result.evaluate_metrics_clientapp)
    print(json.dumps({
        "keys": list(result.arrays),
        "w": result.arrays["w"].tolist(),
        "train": dict(result.train_metrics_clientapp[last]),
        "evaluate": dict(result.evaluate_metrics_clientapp[last]),
    }))
"""


def write_app(root: Path, client_app: str = CLIENT_APP) -> Path:
    app = root / "legacy-numpy"
    package = app / "legacy_numpy"
    package.mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "client_app.py").write_text(client_app)
    (package / "server_app.py").write_text(SERVER_APP)
    return app


def simulate(app: Path, backend: str, cwd: Path) -> dict[str, Any]:
    args = ["--nodes", "4", "--backend", backend, "--seed", "0", "--out", "results"]
    done = subprocess.run(
        [str(FEDCORE), "simulate", str(app), *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    found: dict[str, Any] = json.loads(line)
    return found


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_numpy_client_app_trains_under_fedcores_fedavg(tmp_path: Path, backend: str) -> None:
    found = simulate(write_app(tmp_path), backend, tmp_path)

    assert found["keys"] == ["w"]  # the arrays came back under the name they were sent
    assert found["w"] == [9.0, 9.0]
    # weighted by num-examples: (1*1 + 2*2 + 3*3 + 4*4) / 10
    assert found["train"] == {"step": 3.0}
    assert found["evaluate"] == {"accuracy": 0.5, "loss": 18.0}
    assert (tmp_path / "results").is_dir()


def test_the_older_client_fn_of_a_cid(tmp_path: Path) -> None:
    older = CLIENT_APP.replace(
        CLIENT_APP[CLIENT_APP.index("def client_fn") : CLIENT_APP.index("\n\napp =")],
        OLDER_CLIENT_FN.rstrip("\n"),
    )
    assert "def client_fn(cid: str)" in older

    found = simulate(write_app(tmp_path, older), "inline", tmp_path)

    assert found["w"] == [9.0, 9.0]


def test_a_numpy_client_app_runs_on_a_link_with_two_nodes(tmp_path: Path) -> None:
    app = write_app(tmp_path)
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        done = deployment.fedcore("run", str(app), "--stream", timeout=150)

    assert done.returncode == 0, done.stdout + done.stderr
    [found] = printed_objects(done.stdout.splitlines())
    # steps 1 and 2, weighted by themselves: (1 + 4) / 3 a round, 3 rounds
    assert found["w"] == pytest.approx([5.0, 5.0])
    assert found["keys"] == ["w"]
