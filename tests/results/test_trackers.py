"""``fedcore simulate --track``: whole processes, each tracker's record read back by its library.

MLflow through its client on a file store, TensorBoard through its event accumulator,
W&B from its offline run file (``WANDB_MODE=offline``: no account, no network). Each
must hold the run's config and, for every round, the values ``metrics.jsonl`` holds.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore.errors import TrackerError
from fedcore.results.reading import RunResults, read_run
from fedcore.results.trackers import create_trackers
from fedcore.results.trackers.base import TrackedRun, Tracker
from fedcore.results.trackers.feed import Trackers
from fedcore.testing.network import closed_port

FEDCORE = Path(sys.executable).parent / "fedcore"

APPS = """\
import asyncio
import shutil
import time
from pathlib import Path

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

client = fc.ClientApp()


@client.train()
def train(msg, context):
    server_round = msg.content["config"]["server-round"]
    partition = context.node_config["partition-id"]
    metrics = {"num-examples": 10 + partition, "loss": 1.0 / (server_round + partition)}
    return fc.Message(fc.RecordDict({"arrays": msg.content["arrays"],
                                     "metrics": fc.MetricRecord(metrics)}), reply_to=msg)


@client.evaluate()
def evaluate(msg, context):
    server_round = msg.content["config"]["server-round"]
    metrics = {"num-examples": 5, "accuracy": server_round / 10, "per-class": [0.5, 0.25]}
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid, context):
    store = context.run_config.get("remove-store-at-round-2")

    async def central(server_round, arrays):
        if store and server_round == 2:
            # Round 1 is in the MLflow file store, each of its metrics; then the store
            # goes, under the tracker.
            names = ("replies", "failures", "seconds", "server/accuracy",
                     "evaluate/accuracy", "train/loss")
            deadline = time.monotonic() + 30
            while not all(any(p.read_text() for p in Path(store).glob(f"*/*/metrics/{name}"))
                          for name in names):
                assert time.monotonic() < deadline, "round 1 never reached the store"
                await asyncio.sleep(0.01)
            shutil.rmtree(store)
        return fc.MetricRecord({"accuracy": 0.5 + server_round / 100})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)
    return await strategy.start(grid, fc.ArrayRecord({"w": np.zeros(2)}),
                                num_rounds=context.run_config["num-server-rounds"],
                                evaluate_fn=central)


app = fc.App(server=server, client=client)
"""


def environment(home: Path) -> dict[str, str]:
    """W&B offline, its files under ``home``. MLflow's file store is not allowed here:
    naming a directory as its store is what allows it."""
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_CACHE_DIR": str(home / "wandb-cache"),
        "WANDB_DATA_DIR": str(home / "wandb-data"),
    }


def simulate(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 100
) -> subprocess.CompletedProcess[str]:
    (cwd / "tracker_apps.py").write_text(APPS)
    return subprocess.run(
        [str(FEDCORE), "simulate", "tracker_apps:app", "-n", "3", "--seed", "1",
         "--backend", "inline", "--out", "runs", "--quiet", *args],
        cwd=cwd, env=env or environment(cwd), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def only_run(parent: Path) -> RunResults:
    [path] = list(parent.iterdir())
    return read_run(path)


def expected_series(run: RunResults) -> dict[str, list[tuple[int, float]]]:
    """What every tracker should hold, from ``metrics.jsonl``: each number, by round."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in run.rounds:
        numbers = {"replies": row["replies"], "failures": row["failures"],
                   "seconds": row["elapsed"]}  # fmt: skip
        for scope in ("train", "evaluate", "server"):
            numbers.update(
                (f"{scope}/{key}", value)
                for key, value in row[scope].items()
                if not isinstance(value, list)
            )
        for name, value in numbers.items():
            series.setdefault(name, []).append((row["round"], float(value)))
    return series


TRACKED = pytest.mark.timeout(240)
"""For the tests that share :func:`tracked`, whichever runs it: the one process imports
all three libraries, some 10 s of CPU, which took 108 s on a 2-core machine at load 15."""


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    """One simulation recorded by all three trackers."""
    cwd = tmp_path_factory.mktemp("tracked")
    store = (cwd / "mlruns").as_uri()
    done = simulate(cwd, "--run-config", "num-server-rounds=3 lr=0.1", "--track", "tensorboard",
                    "--track", "wandb", "--track", f"mlflow={store}", timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = only_run(cwd / "runs")
    assert [row["round"] for row in run.rounds] == [1, 2, 3]
    return run


@TRACKED
def test_mlflow_holds_the_config_and_every_round(
    tracked: RunResults, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    where = tracked.run["trackers"]["mlflow"]
    client = MlflowClient(where["uri"])
    run = client.get_run(where["run_id"])
    assert run.info.run_name == tracked.path.name
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "tracker_apps"
    assert run.data.tags["fedcore.results"] == str(Path("runs") / tracked.path.name)
    params = run.data.params
    assert (params["app"], params["seed"], params["backend"], params["nodes"]) == (
        "tracker_apps", "1", "inline", "3",
    )  # fmt: skip
    assert (params["config.lr"], params["config.num-server-rounds"]) == ("0.1", "3")
    assert params["resources.num_cpus"] == "1.0"

    expected = expected_series(tracked)
    assert set(run.data.metrics) == set(expected)
    for name, points in expected.items():
        history = client.get_metric_history(where["run_id"], name)
        assert [(m.step, m.value) for m in history] == points, name


@TRACKED
def test_tensorboard_holds_the_config_and_every_round(tracked: RunResults) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    directory = tracked.run["trackers"]["tensorboard"]["dir"]
    assert directory == str(Path("runs") / tracked.path.name / "tensorboard")
    events = EventAccumulator(str(tracked.path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()

    expected = expected_series(tracked)
    assert set(events.Tags()["scalars"]) == set(expected)
    for name, points in expected.items():
        # TensorBoard keeps scalars as float32.
        float32 = [(step, float(np.float32(value))) for step, value in points]
        assert [(e.step, e.value) for e in events.Scalars(name)] == float32, name

    [config] = events.Tensors("config")
    table = {key.decode(): value.decode() for key, value in make_ndarray(config.tensor_proto)}
    assert table["config.lr"] == "0.1"
    assert (table["app"], table["seed"], table["nodes"]) == ("tracker_apps", "1", "3")
    [status] = events.Tensors("status")
    assert (status.step, make_ndarray(status.tensor_proto)[0][0]) == (3, b"completed")


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a W&B run file, decoded with W&B's own protocol buffers.

    wandb 0.31 reads these files in its Go core only (``wandb sync``, ``wandb leet``),
    so the framing is read here: a 7-byte header (``:W&B``, 0xBEE1, version 0), then
    32 KiB blocks of chunks, each ``crc32(type + data)``, length (2 bytes), type (1:
    whole, 2: first, 3: middle, 4: last) and data, a block's tail under 7 bytes left
    as padding.
    """
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:7] == b":W&B" + struct.pack("<HB", 0xBEE1, 0)
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) == checksum, f"corrupt chunk at {position}"
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            yield record


@TRACKED
def test_wandb_offline_holds_the_config_and_every_round(tracked: RunResults) -> None:
    where = tracked.run["trackers"]["wandb"]
    assert (where["project"], where["mode"]) == ("tracker_apps", "offline")
    # Relative to where the command ran, as the results directory is.
    [run_file] = (tracked.path.parent.parent / where["dir"]).glob("run-*.wandb")
    records = list(wandb_records(run_file))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.display_name, run.project) == (
        where["run_id"], tracked.path.name, "tracker_apps",
    )  # fmt: skip
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["config"] == {"num-server-rounds": 3, "lr": 0.1}
    assert (config["app"], config["seed"], config["backend"], config["nodes"]) == (
        "tracker_apps", 1, "inline", 3,
    )  # fmt: skip

    logged: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    logged.setdefault(key, []).append(
                        (record.history.step.num, json.loads(item.value_json))
                    )
    assert logged == expected_series(tracked)
    [end] = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


def test_a_tracker_failing_mid_run_costs_its_record_not_the_run(tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    done = simulate(
        tmp_path, "--run-config", f"num-server-rounds=3 remove-store-at-round-2='{store}'",
        "--track", f"mlflow={store.as_uri()}", "--track", "tensorboard",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "tracker failed" in line]
    assert len(warnings) == 1, done.stderr
    assert "the mlflow tracker failed at round 2" in warnings[0]
    run = only_run(tmp_path / "runs")
    assert run.run["status"] == "completed"
    assert [row["round"] for row in run.rounds] == [1, 2, 3]
    assert "the mlflow tracker failed at round 2" in (run.path / "log.txt").read_text()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("replies")] == [1, 2, 3]  # the other goes on


@pytest.mark.parametrize(
    ("args", "said", "left"),
    [
        # A log directory that cannot be made (a file is in the way): the run's results
        # directory, made by then, goes with the run that never began.
        (["--track", "tensorboard=a-file"], "the tensorboard tracker cannot write a-file/", []),
        # wandb made unimportable: refused before any directory is made.
        (["--track", "wandb"], "pip install 'fedcore[wandb]'", None),
        # MLflow's file store refused by MLflow's own setting: its whole advice is kept.
        (["--track", "mlflow=./store"], "set `MLFLOW_ALLOW_FILE_STORE=true`", []),
        # A tracking server that is not running: said in seconds, not after retries.
        (["--track", f"mlflow=http://127.0.0.1:{closed_port()}"], "(is the tracking server", []),
    ],
)
def test_a_tracker_that_cannot_start_ends_the_command_with_one_line(
    tmp_path: Path, args: list[str], said: str, left: list[Path] | None
) -> None:
    (tmp_path / "a-file").write_text("")
    env = environment(tmp_path)
    if "wandb" in args:  # a machine without wandb: Python refuses its import, as there
        blocker = tmp_path / "blocker"
        blocker.mkdir()
        (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    if "mlflow=./store" in args:
        env["MLFLOW_ALLOW_FILE_STORE"] = "false"
    done = simulate(tmp_path, "--run-config", "num-server-rounds=1", *args, env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert said in line, line
    runs = tmp_path / "runs"
    assert (list(runs.iterdir()) if runs.exists() else None) == left


def test_a_store_that_refuses_the_run_is_a_tracker_error() -> None:
    """A tracking server that is not running (refused before MLflow's minutes of
    retries); TensorBoard with nowhere to write."""
    for spec, said in [
        (
            f"mlflow=http://127.0.0.1:{closed_port()}",
            "the mlflow tracker cannot reach http://127.0.0.1:[0-9]+: Connection refused "
            "\\(is the tracking server running there",
        ),
        ("tensorboard", "keeps none \\(--no-save\\): name a log directory"),
    ]:
        with pytest.raises(TrackerError, match=said):
            Trackers(create_trackers([spec])).start(RUN)
    with pytest.raises(TrackerError, match="unknown tracker 'comet'"):
        create_trackers(["comet"])
    with pytest.raises(TrackerError, match="asked for twice"):
        create_trackers(["tensorboard", "tensorboard=elsewhere"])


def test_fc_simulate_tracks_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "tracker_apps.py").write_text(APPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = fc.run_simulation("tracker_apps:app", nodes=2, seed=0, backend="inline",
                               run_config={"num-server-rounds": 2}, progress=False,
                               track=[f"tensorboard={tmp_path / 'tb'}"])  # fmt: skip
    assert result.out is None  # no results directory: the events went where named
    [run_dir] = (tmp_path / "tb").iterdir()
    assert run_dir.name.endswith("-tracker_apps-0")
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("server/accuracy")] == [1, 2]


class Recording(Tracker):
    """A tracker of the test's own: keeps what it is told; can refuse, fail or hang."""

    name = "recording"

    def __init__(self, where: str | None = None) -> None:
        super().__init__(where)
        self.calls: list[tuple[str, Any]] = []
        self.refuse = self.fail_at = self.hang = None

    def start(self, run: TrackedRun) -> dict[str, str]:
        if self.refuse:
            raise OSError(self.refuse)
        self.calls.append(("start", run.name))
        return {"where": "here"}

    def log_round(self, step: int, metrics: Any, at: float) -> None:
        if step == self.fail_at:
            raise RuntimeError(f"broken at {step}")
        self.calls.append(("round", step))

    def finish(self, status: str, at: float) -> None:
        if self.hang is not None:
            self.hang.wait()
        self.calls.append(("finish", status))


def named(name: str) -> Recording:
    tracker = Recording()
    tracker.name = name
    return tracker


ROW = {"round": 1, "replies": 2, "failures": 0, "elapsed": 0.1, "train": {}, "evaluate": {},
       "server": {"accuracy": 0.5}}  # fmt: skip
RUN = TrackedRun("run", {"app": "a"}, None, 0.0)


def test_a_failing_tracker_is_dropped_and_the_others_see_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, healthy = named("failing"), named("healthy")
    failing.fail_at = 2
    feed = Trackers([failing, healthy])
    feed.start(RUN)
    assert feed.where == {"failing": {"where": "here"}, "healthy": {"where": "here"}}
    for step in (1, 2, 3):
        feed.log_round({**ROW, "round": step})
    feed.finish("completed")
    assert failing.calls == [("start", "run"), ("round", 1)]
    assert healthy.calls == [("start", "run"), ("round", 1), ("round", 2), ("round", 3),
                             ("finish", "completed")]  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "the failing tracker failed at round 2" in warning
    assert "broken at 2" in warning


def test_a_refusal_at_start_closes_the_trackers_already_started() -> None:
    first, second = named("first"), named("second")
    second.refuse = "no such store"
    with pytest.raises(TrackerError, match="the second tracker could not start: no such"):
        Trackers([first, second]).start(RUN)
    assert first.calls == [("start", "run"), ("finish", "failed")]


def test_a_hung_tracker_does_not_hold_the_end_of_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    hung = named("hung")
    hung.hang = threading.Event()
    feed = Trackers([hung], finish_timeout=0.2)
    feed.start(RUN)
    feed.finish("completed")  # returns, with the tracker still in finish()
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "the hung tracker did not finish within 0.2 s" in warning
    hung.hang.set()
