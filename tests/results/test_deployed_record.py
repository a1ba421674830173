"""A deployed run's results directory, written from its record: what run.json says of each end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedcore.domain import ArrayRecord, LogLine, MetricsLine, RecordDict, Run, RunStatus
from fedcore.results.deployed import DeployedRecorder, directory_tag, run_document
from fedcore.results.reading import read_run

HEADER = {
    "run": 7,
    "seed": None,
    "config": {"rounds": 2},
    "started": "2025-01-01T00:00:05+00:00",
    "fedcore": "9.9",
    "app": "demo",
    "backend": "deployment",
    "nodes": 3,
}


def round_line(n: int) -> dict[str, object]:
    return {"round": n, "num_rounds": 2, "train": {}, "evaluate": {}, "server": {"acc": n / 2}}


def test_a_run_that_never_started_says_what_the_link_knows() -> None:
    run = Run(7, {"rounds": 2}, RunStatus.PENDING, created_at=1735689600.0)
    document = run_document(run, None)
    assert document["status"] == "pending"
    assert document["app"] == ""
    assert document["start"] == "2025-01-01T00:00:00+00:00"
    assert document["end"] is None
    assert "error" not in document
    assert directory_tag(run) == "run7"
    assert directory_tag(Run(7, seed=0)) == 0


def test_a_failed_run_says_why_and_when_it_ended() -> None:
    run = Run(7, {"rounds": 2}, RunStatus.FAILED, "the ServerApp went silent", seed=3)
    run.finished_at = 1735689660.0
    document = run_document(run, HEADER)
    assert document["status"] == "failed"
    assert document["error"] == "the ServerApp went silent"
    assert document["end"] == "2025-01-01T00:01:00+00:00"
    assert document["start"] == HEADER["started"]
    assert (document["app"], document["nodes"], document["fedcore"]) == ("demo", 3, "9.9")
    assert document["seed"] == 3
    assert document["backend"] == "deployment"


def test_a_directory_left_midway_is_read_and_says_running(tmp_path: Path) -> None:
    recorder = DeployedRecorder(tmp_path, Run(7, {"rounds": 2}, RunStatus.PENDING))
    recorder.add_log(LogLine(1, 1735689605.0, "INFO fedcore.strategy: round 1/2"))
    recorder.add_metrics(MetricsLine(1, HEADER))
    recorder.add_metrics(MetricsLine(2, round_line(1)))
    recorder.close()  # killed before the run ended: never finished
    read = read_run(tmp_path)
    assert read.run["status"] == "running"
    assert read.series("server.acc") == ([1], [0.5])
    assert (tmp_path / "log.txt").read_text().endswith(" INFO fedcore.strategy: round 1/2\n")


def test_a_finished_run_keeps_its_model_and_a_run_without_one_has_none(tmp_path: Path) -> None:
    run = Run(7, {"rounds": 2}, RunStatus.RUNNING)
    recorder = DeployedRecorder(_mkdir(tmp_path / "with"), run)
    for seq, document in enumerate([HEADER, round_line(1), round_line(2)], 1):
        recorder.add_metrics(MetricsLine(seq, document))
    ended = Run(7, {"rounds": 2}, RunStatus.COMPLETED, finished_at=1735689700.0)
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    recorder.finish(ended, RecordDict({"arrays": ArrayRecord({"w": weights})}))
    assert recorder.rounds == 2
    with np.load(tmp_path / "with" / "model.npz") as model:
        np.testing.assert_array_equal(model["w"], weights)
    run_json = json.loads((tmp_path / "with" / "run.json").read_text())
    assert run_json["status"] == "completed"
    without = DeployedRecorder(_mkdir(tmp_path / "without"), run)
    without.finish(ended, None)
    assert not (tmp_path / "without" / "model.npz").exists()
    assert read_run(tmp_path / "without").rounds == []


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def test_a_run_that_should_stop_ended_says_after_which_round(tmp_path: Path) -> None:
    """The round line ``should_stop`` ended the run after carries ``stopped_early``;
    run.json says so at once, and keeps saying it when the run ends."""
    recorder = DeployedRecorder(tmp_path, Run(7, {"rounds": 5}, RunStatus.RUNNING))
    recorder.add_metrics(MetricsLine(1, HEADER))
    recorder.add_metrics(MetricsLine(2, round_line(1)))
    assert "stopped_early_after_round" not in json.loads((tmp_path / "run.json").read_text())
    recorder.add_metrics(MetricsLine(3, {**round_line(2), "stopped_early": True}))
    assert json.loads((tmp_path / "run.json").read_text())["stopped_early_after_round"] == 2
    recorder.finish(Run(7, {"rounds": 5}, RunStatus.COMPLETED, finished_at=1735689700.0), None)
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert (run_json["status"], run_json["stopped_early_after_round"]) == ("completed", 2)
