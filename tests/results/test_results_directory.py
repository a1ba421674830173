"""Every simulation leaves a results directory: whole ``fedcore simulate`` processes, read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fedcore as fc
from fedcore.results import RESULTS_ENV
from fedcore.results.reading import read_run

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"
FEDCORE = Path(sys.executable).parent / "fedcore"

APPS = """\
import time

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

client = fc.ClientApp()


@client.train()
def train(msg, context):
    if context.run_config.get("slow-from", 1e9) <= msg.content["config"]["server-round"]:
        time.sleep(60)
    return fc.Message(fc.RecordDict({"arrays": msg.content["arrays"],
                                     "metrics": fc.MetricRecord({"num-examples": 1})}),
                      reply_to=msg)


def server_of(rounds, then=None):
    server = fc.ServerApp()

    @server.main()
    async def main(grid, context):
        arrays = fc.ArrayRecord({"w": np.zeros(2)})
        await FedAvg(fraction_evaluate=0.0).start(grid, arrays, num_rounds=rounds)
        if then is not None:
            raise then

    return server


failing = fc.App(server=server_of(2, RuntimeError("the author's bug, after round 2")),
                 client=client)
slow = fc.App(server=server_of(10), client=client)
"""


def simulate(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
        env=env,
        check=False,
    )


def quickstart(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return simulate(str(QUICKSTART), "--nodes", "10", "--seed", "3", "--backend", "inline",
                    "--run-config", "num-server-rounds=3", *args, cwd=cwd, env=env)  # fmt: skip


def only_run(parent: Path) -> Path:
    [run] = list(parent.iterdir())
    return run


def test_a_simulation_leaves_its_record_under_results_by_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != RESULTS_ENV}
    done = quickstart(cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr

    run_dir = only_run(tmp_path / "results")
    assert run_dir.name.endswith("-quickstart-numpy-3")
    assert f"results: results/{run_dir.name}" in done.stderr
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    assert (record["app"], record["seed"], record["backend"], record["nodes"]) == (
        "quickstart-numpy", 3, "inline", 10,
    )  # fmt: skip
    assert record["config"]["num-server-rounds"] == 3
    assert record["resources"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert record["start"] <= record["end"]

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["run"] == record["run_id"]
    assert [line["round"] for line in lines[1:]] == [1, 2, 3]
    assert all("accuracy" in line["server"] and "loss" in line["train"] for line in lines[1:])
    log = (run_dir / "log.txt").read_text()
    assert "round 3/3" in log
    assert (run_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_saved_model_is_what_main_returned(tmp_path: Path) -> None:
    done = quickstart("--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    saved = np.load(only_run(tmp_path / "runs") / "model.npz")

    result = fc.run_simulation(str(QUICKSTART), nodes=10, seed=3, backend="inline",
                               run_config="num-server-rounds=3", progress=False,
                               out=tmp_path / "python")  # fmt: skip
    assert result.out is not None
    assert result.out.parent == tmp_path / "python"
    model = result.value
    assert set(saved.files) == set(model.keys())
    for name, array in zip(model.keys(), model.to_numpy_ndarrays(), strict=True):
        np.testing.assert_array_equal(saved[name], array)  # the same seed, bit for bit


def test_no_save_keeps_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != RESULTS_ENV}
    done = quickstart("--no-save", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    assert "results:" not in done.stderr


def test_a_failed_run_says_so_and_keeps_its_rounds(tmp_path: Path) -> None:
    (tmp_path / "results_apps.py").write_text(APPS)
    done = simulate("results_apps:failing", "-n", "2", "--seed", "0", "--backend", "inline",
                    "--out", "runs", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    run = read_run(only_run(tmp_path / "runs"))
    assert run.run["status"] == "failed"
    assert run.run["error"] == "RuntimeError: the author's bug, after round 2"
    assert [row["round"] for row in run.rounds] == [1, 2]
    assert not (run.path / "model.npz").exists()


def test_a_killed_run_keeps_every_round_it_finished(tmp_path: Path) -> None:
    (tmp_path / "results_apps.py").write_text(APPS)
    process = subprocess.Popen(
        [
            str(FEDCORE),
            "simulate",
            "results_apps:slow",
            "-n",
            "2",
            "--seed",
            "0",
            "--backend",
            "inline",
            "--out",
            "runs",
            "--run-config",
            "slow-from=3",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a condition with a deadline: round 2 is on disk
            runs = list((tmp_path / "runs").glob("*/metrics.jsonl"))
            if runs and len(read_run(runs[0].parent).rounds) == 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("round 2 never reached metrics.jsonl")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    run = read_run(only_run(tmp_path / "runs"))
    assert run.run["status"] == "running"  # it never ended
    assert [row["round"] for row in run.rounds] == [1, 2]
