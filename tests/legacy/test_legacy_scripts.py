"""Legacy Flower scripts and modules under ``fedcore simulate``, as whole processes.

Each program is written here as Flower's users write them (``import flwr`` throughout,
``flwr`` not installed: fedcore's shim answers), run as ``fedcore simulate script.py --
ARGS`` or ``fedcore simulate -m package.main ARGS``, and judged by what it prints and
its exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.flower_repo import FlowerRepoUnavailable, extract_flower

FEDCORE = Path(sys.executable).parent / "fedcore"

pytestmark = pytest.mark.timeout(120)

LEGACY_SCRIPT = '''
"""A start_simulation script: NumPyClients over per-client data, a legacy FedAvg."""
import argparse
import json

import flwr as fl
import numpy as np
from flwr.client import NumPyClient
from flwr.common import ndarrays_to_parameters

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=1)
args = parser.parse_args()

# Client i holds i (and i + 1 examples): FedAvg's weighted mean moves the model by 2.0
# a round, where a plain mean would move it by 1.5.
DATA = [np.full(3, float(i)) for i in range(4)]


class Client(NumPyClient):
    def __init__(self, data):
        self.data = data

    def fit(self, parameters, config):
        examples = int(self.data[0]) + 1
        return [parameters[0] + self.data], examples, {"seen": float(self.data[0])}

    def evaluate(self, parameters, config):
        return float(np.sum(parameters[0])), 1, {}


def generate_client_fn(data):
    def client_fn(context):
        return Client(data[int(context.node_config["partition-id"])]).to_client()

    return client_fn


strategy = fl.server.strategy.FedAvg(
    min_fit_clients=4,
    min_evaluate_clients=4,
    min_available_clients=4,
    initial_parameters=ndarrays_to_parameters([np.zeros(3)]),
)
history = fl.simulation.start_simulation(
    client_fn=generate_client_fn(DATA),
    num_clients=4,
    config=fl.server.ServerConfig(num_rounds=args.rounds),
    strategy=strategy,
    client_resources={"num_cpus": 1, "num_gpus": 0.0, "accelerator": 1},
    ray_init_args={"include_dashboard": False},
    actor_kwargs={"on_actor_init_fn": None},
)
print(json.dumps({"losses": history.losses_distributed}))
'''

HYDRA_MAIN = '''
"""A Hydra app run as `python -m hyapp.main`: Message-API apps, made in main, run by
flwr.simulation.run_simulation."""
import json

import hydra
import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="base", version_base=None)
def main(cfg: DictConfig) -> None:
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"].to_numpy_ndarrays()
        updated = ArrayRecord([arrays[0] + cfg.step])
        metrics = MetricRecord({"num-examples": 1})
        return Message(RecordDict({"arrays": updated, "metrics": metrics}), reply_to=msg)

    server_app = ServerApp()

    @server_app.main()
    def server_main(grid: Grid, context: Context) -> None:
        result = FedAvg(fraction_evaluate=0.0).start(
            grid=grid, initial_arrays=ArrayRecord([np.zeros(2)]), num_rounds=cfg.num_rounds
        )
        nodes = len(list(grid.get_node_ids()))
        final = result.arrays.to_numpy_ndarrays()[0].tolist()
        print(json.dumps({"nodes": nodes, "final": final}))

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=cfg.num_clients,
        backend_config={"client_resources": {"num_cpus": 1}},
    )


if __name__ == "__main__":
    main()
'''

HYDRA_CONFIG = """
num_rounds: 1
num_clients: 3
step: 0.5
"""


BASELINE_CLIENT = """
import flwr as fl
import numpy as np


class FlowerClient(fl.client.NumPyClient):
    def __init__(self, data, lr):
        self.data, self.lr = data, lr

    def fit(self, parameters, config):
        return [parameters[0] + self.lr * self.data], len(self.data), {}


def generate_client_fn(partitions, lr):
    def client_fn(context):
        return FlowerClient(partitions[context.node_config["partition-id"]], lr).to_client()

    return client_fn
"""

BASELINE_MAIN = """
import json
import pickle
from pathlib import Path

import flwr as fl
import hydra
import numpy as np
from flwr.common import ndarrays_to_parameters
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

from hbase.client import generate_client_fn


@hydra.main(config_path="conf", config_name="base", version_base=None)
def main(cfg):
    partitions = [np.full(2, float(i)) for i in range(cfg.num_clients)]

    def evaluate(server_round, parameters, config):
        return float(np.sum(parameters[0])), {}

    strategy = instantiate(
        cfg.strategy,
        initial_parameters=ndarrays_to_parameters([np.zeros(2)]),
        evaluate_fn=evaluate,
    )
    history = fl.simulation.start_simulation(
        client_fn=generate_client_fn(partitions, cfg.lr),
        num_clients=cfg.num_clients,
        config=fl.server.ServerConfig(num_rounds=cfg.num_rounds),
        strategy=strategy,
        client_resources={"num_cpus": cfg.client_resources.num_cpus, "num_gpus": 0.0},
    )
    # As the baselines keep their results: the History pickled into Hydra's output dir.
    results = Path(HydraConfig.get().runtime.output_dir) / "results.pkl"
    results.write_bytes(pickle.dumps({"history": history}))
    kept = pickle.loads(results.read_bytes())["history"].losses_centralized
    print(json.dumps({"centralized": history.losses_centralized, "kept": kept}))


if __name__ == "__main__":
    main()
"""

BASELINE_CONFIG = """
num_rounds: 2
num_clients: 4
lr: 1.0
client_resources:
  num_cpus: 1
strategy:
  _target_: flwr.server.strategy.FedAvg
  fraction_fit: 1.0
  fraction_evaluate: 0.0
  min_fit_clients: ${num_clients}
  min_available_clients: ${num_clients}
"""


def fedcore(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=cwd,
        check=False,
    )


def printed(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON line the program prints."""
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    found: dict[str, Any] = json.loads(line)
    return found


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_start_simulation_script_runs_and_gets_its_history(tmp_path: Path, backend: str) -> None:
    script = write(tmp_path / "sim" / "simulation.py", LEGACY_SCRIPT)

    done = fedcore("--backend", backend, str(script), "--", "--rounds", "3", cwd=tmp_path)

    # Three rounds, each moving every weight by the weighted mean 2.0: the loss (the
    # sum of 3 weights) after round r is 6r, on every client.
    assert printed(done) == {"losses": [[1, 6.0], [2, 12.0], [3, 18.0]]}
    ignored = [line for line in done.stderr.splitlines() if "fedcore runs without Ray" in line]
    assert len(ignored) == 1, done.stderr
    assert ignored[0].endswith(
        "start_simulation() ignored ray_init_args, actor_kwargs, "
        "client_resources['accelerator']: fedcore runs without Ray"
    )


def test_a_hydra_module_finds_its_config_and_takes_overrides(tmp_path: Path) -> None:
    write(tmp_path / "hyapp" / "__init__.py", "")
    write(tmp_path / "hyapp" / "main.py", HYDRA_MAIN)
    write(tmp_path / "hyapp" / "conf" / "base.yaml", HYDRA_CONFIG)

    defaults = fedcore("-m", "hyapp.main", cwd=tmp_path)
    overridden = fedcore("-m", "hyapp.main", "num_rounds=4", "step=0.25", cwd=tmp_path)

    assert printed(defaults) == {"nodes": 3, "final": [0.5, 0.5]}
    assert printed(overridden) == {"nodes": 3, "final": [1.0, 1.0]}


def test_a_baseline_shaped_hydra_app_instantiates_a_flower_strategy(tmp_path: Path) -> None:
    """As Flower's baselines are: `python -m hbase.main`, the strategy a Hydra
    `_target_: flwr.server.strategy.FedAvg`, the client_fn a closure made in a module of
    the package (so pickled by name, its data by value), a server-side evaluate_fn."""
    write(tmp_path / "hbase" / "__init__.py", "")
    write(tmp_path / "hbase" / "client.py", BASELINE_CLIENT)
    write(tmp_path / "hbase" / "main.py", BASELINE_MAIN)
    write(tmp_path / "hbase" / "conf" / "base.yaml", BASELINE_CONFIG)

    defaults = fedcore("-m", "hbase.main", cwd=tmp_path)
    overridden = fedcore("-m", "hbase.main", "lr=2.0", "num_rounds=3", cwd=tmp_path)

    # Each round adds lr times the mean of the clients' data (0, 1, 2, 3: 1.5) to both
    # weights; the centralized loss is their sum, round 0 included.
    three = [[0, 0.0], [1, 3.0], [2, 6.0]]
    assert printed(defaults) == {"centralized": three, "kept": three}
    four = [[0, 0.0], [1, 6.0], [2, 12.0], [3, 18.0]]
    assert printed(overridden) == {"centralized": four, "kept": four}


def test_a_client_fn_that_cannot_be_pickled_is_one_line_that_names_the_way_out(
    tmp_path: Path,
) -> None:
    # The client_fn refers to a lock of the script's: a lock does not pickle.
    locking = LEGACY_SCRIPT.replace(
        "DATA = [", "import threading\nLOCK = threading.Lock()\nDATA = ["
    ).replace(
        "        return Client(data", "        assert not LOCK.locked()\n        return Client(data"
    )
    script = write(tmp_path / "locked.py", locking)

    done = fedcore(str(script), cwd=tmp_path)

    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "cannot be pickled for the process backend's workers" in line
    assert "fedcore simulate --backend inline" in line


def test_client_resources_size_the_pool_and_the_command_line_wins(tmp_path: Path) -> None:
    two_cpus = LEGACY_SCRIPT.replace('"num_cpus": 1,', '"num_cpus": 2,')
    script = write(tmp_path / "two_cpus.py", two_cpus)

    scripts = fedcore("--system-cpus", "4", str(script), cwd=tmp_path)
    flags = fedcore("--system-cpus", "4", "--num-cpus", "4", str(script), cwd=tmp_path)

    assert printed(scripts) == {"losses": [[1, 6.0]]}
    assert "process pool: 2 workers" in scripts.stderr
    assert printed(flags) == {"losses": [[1, 6.0]]}
    assert "process pool: 1 workers" in flags.stderr


def test_the_scripts_exit_status_is_the_processs(tmp_path: Path) -> None:
    script = write(tmp_path / "ends.py", "import sys\nimport flwr\nsys.exit(int(sys.argv[1]))\n")
    raises = write(tmp_path / "raises.py", "raise RuntimeError('the script failed')\n")

    assert fedcore(str(script), "--", "3", cwd=tmp_path).returncode == 3
    assert fedcore(str(script), "0", cwd=tmp_path).returncode == 0
    failed = fedcore(str(raises), cwd=tmp_path)
    assert failed.returncode == 1
    assert "RuntimeError: the script failed" in failed.stderr
    assert "raises.py" in failed.stderr


def test_missing_scripts_and_modules_are_clear_errors(tmp_path: Path) -> None:
    no_file = fedcore("missing.py", cwd=tmp_path)
    no_module = fedcore("-m", "no_such_package.main", cwd=tmp_path)
    app_option = fedcore("--nodes", "3", str(write(tmp_path / "s.py", "")), cwd=tmp_path)

    assert no_file.returncode == 2
    assert "error: no such script: 'missing.py'" in no_file.stderr
    assert no_module.returncode == 2
    assert "error: no module named 'no_such_package.main'" in no_module.stderr
    assert app_option.returncode == 2
    assert "--nodes is for an app directory" in app_option.stderr


def test_an_app_directory_takes_no_arguments_and_a_mistyped_option_is_named(
    tmp_path: Path,
) -> None:
    app = tmp_path / "app"
    app.mkdir()

    mistyped = fedcore(str(app), "--nodez", "3", cwd=tmp_path)
    extra = fedcore(str(app), "more", cwd=tmp_path)

    assert mistyped.returncode == 2
    assert "error: No such option '--nodez'" in mistyped.stderr
    assert extra.returncode == 2
    assert "only a script (.py) or -m MODULE takes arguments" in extra.stderr


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_flowers_e2e_bare_simulation_script_runs_unchanged(tmp_path: Path, backend: str) -> None:
    try:
        extract_flower(["framework/e2e/e2e-bare"], tmp_path)
    except FlowerRepoUnavailable as exc:
        pytest.skip(f"{exc} (tests/flower_apps)")
    app = tmp_path / "framework" / "e2e" / "e2e-bare"

    done = fedcore("--backend", backend, "simulation.py", cwd=app)

    # Its own asserts check the History (the loss fell, every client's state grew by two
    # entries a round); its exit status says whether they held. No client failed either.
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "received 2 results and 0 failures" in done.stderr
