"""A deployed run's record through the CLI: ``fedcore run --stream`` keeps it, ``fedcore pull``
fetches it.

One run of ``record_app`` (every round adds one to the model, so its metrics and final
model are known in advance) on a link and two nodes on loopback, streamed into a
results directory; then pulled, into another, before and after the link is killed
and restarted on its SQLite file. Both directories must be what ``fedcore simulate``
leaves, read by ``read_run`` and drawn by ``fedcore plot``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fedcore.results.reading import read_run
from fedcore.testing.deployment import Deployment, printed_objects

RECORD_APP = Path(__file__).resolve().parent / "record_app"
ROUNDS = 3

pytestmark = pytest.mark.timeout(180)


@dataclass
class Streamed:
    deployment: Deployment
    run_id: str
    directory: Path
    printed_model: dict[str, list[object]]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Streamed]:
    root = tmp_path_factory.mktemp("record")
    with Deployment(root) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        done = deployment.fedcore(
            "run", str(RECORD_APP), "--stream", "--run-config", f"rounds={ROUNDS}",
            "--out", str(root / "results"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        run_id = re.search(r"run (\d+) submitted", done.stdout).group(1)  # type: ignore[union-attr]
        (directory,) = (root / "results").iterdir()
        assert f"results: {directory}" in done.stderr
        (printed,) = [o for o in printed_objects(done.stdout.splitlines()) if "model" in o]
        yield Streamed(deployment, run_id, directory, printed["model"])


def model_in(directory: Path) -> dict[str, np.ndarray]:
    with np.load(directory / "model.npz") as arrays:
        return {name: arrays[name] for name in arrays.files}


def check_record(directory: Path, run_id: str, printed_model: dict[str, list[object]]) -> None:
    """``directory`` holds the run's whole record: every round once, the model main returned."""
    run = read_run(directory)
    assert [row["round"] for row in run.rounds] == list(range(1, ROUNDS + 1))
    assert run.series("server.mean") == (list(range(1, ROUNDS + 1)), [1.0, 2.0, 3.0])
    assert run.series("evaluate.mean") == ([1, 2, 3], [1.0, 2.0, 3.0])
    assert run.series("train.loss") == ([1, 2, 3], [1.0, 0.5, 1 / 3])
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    header, *rows = (json.loads(line) for line in lines)
    assert len(rows) == ROUNDS
    assert str(header["run"]) == run_id
    assert header["app"] == "record-app"
    assert run.run["app"] == "record-app"
    assert run.run["backend"] == "deployment"
    assert run.run["nodes"] == 2
    assert run.run["status"] == "completed"
    assert str(run.run["run_id"]) == run_id
    assert run.run["config"]["rounds"] == ROUNDS
    assert run.run["start"] <= run.run["end"]
    model = model_in(directory)
    assert {name: value.tolist() for name, value in model.items()} == printed_model
    np.testing.assert_array_equal(model["w"], np.full((2, 3), 3, np.float32))
    np.testing.assert_array_equal(model["b"], np.arange(4, dtype=np.float64) + 3)
    assert model["w"].dtype == np.float32
    log = (directory / "log.txt").read_text()
    assert '{"model": ' in log
    assert f"round {ROUNDS}/{ROUNDS}" in log


def test_run_stream_keeps_the_whole_record_as_it_goes(streamed: Streamed) -> None:
    check_record(streamed.directory, streamed.run_id, streamed.printed_model)
    # Named as simulate names its directories; a run with no seed by its run id.
    assert re.fullmatch(
        rf"\d{{8}}T\d{{6}}Z-record-app-run{streamed.run_id}", streamed.directory.name
    )
    plotted = streamed.deployment.fedcore("plot", str(streamed.directory), "--terminal")
    assert plotted.returncode == 0, plotted.stderr
    assert "server.mean" in plotted.stdout


def test_pull_writes_the_same_record(streamed: Streamed, tmp_path: Path) -> None:
    done = streamed.deployment.fedcore("pull", streamed.run_id, str(tmp_path / "pulled"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"run {streamed.run_id} (finished:completed): {ROUNDS} rounds, model.npz, "
        f"in {tmp_path / 'pulled'}"
    )
    check_record(tmp_path / "pulled", streamed.run_id, streamed.printed_model)
    for name in ("run.json", "metrics.jsonl", "log.txt"):
        assert (tmp_path / "pulled" / name).read_text() == (streamed.directory / name).read_text()


def test_a_pull_that_cannot_be_done_says_why_in_one_line(
    streamed: Streamed, tmp_path: Path
) -> None:
    deployment = streamed.deployment
    unknown = deployment.fedcore("pull", "7", str(tmp_path / "unknown"))
    assert unknown.returncode == 1
    assert unknown.stderr.splitlines() == ["error: no run 7"]
    assert not (tmp_path / "unknown").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    taken = deployment.fedcore("pull", streamed.run_id, str(tmp_path / "taken"))
    assert taken.returncode == 2
    assert taken.stderr.splitlines() == [
        f"error: {str(tmp_path / 'taken')!r} is not empty: pull a run into a new directory"
    ]
    assert [path.name for path in (tmp_path / "taken").iterdir()] == ["notes.txt"]
    no_token = deployment.fedcore("pull", streamed.run_id, str(tmp_path / "n"), token=False)
    assert no_token.returncode == 2
    (line,) = no_token.stderr.splitlines()
    assert "bearer token" in line
    assert "no token was sent" in line
    assert not (tmp_path / "n").exists()


def test_stream_flags_without_stream_are_refused_before_anything_is_sent(
    streamed: Streamed,
) -> None:
    for flag in (["--out", "elsewhere"], ["--no-save"]):
        done = streamed.deployment.fedcore("run", str(RECORD_APP), *flag)
        assert done.returncode == 2
        assert f"{flag[0]} is for --stream" in done.stderr
    listed = json.loads(streamed.deployment.fedcore("ls", "--json").stdout)
    assert [run["run_id"] for run in listed] == [streamed.run_id]


def test_the_record_survives_a_link_killed_and_restarted(
    streamed: Streamed, tmp_path: Path
) -> None:
    """Last in the module: it kills the link the other tests share."""
    deployment = streamed.deployment
    assert deployment.link is not None
    deployment.kill(deployment.link)
    deployment.restart_link()
    done = deployment.fedcore("pull", streamed.run_id, str(tmp_path / "again"))
    assert done.returncode == 0, done.stderr
    check_record(tmp_path / "again", streamed.run_id, streamed.printed_model)
    for name in ("run.json", "metrics.jsonl", "log.txt"):
        assert (tmp_path / "again" / name).read_text() == (streamed.directory / name).read_text()
