"""``fedcore plot``: runs read back from their results directories, drawn as pictures or text."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import fedcore as fc
from fedcore.errors import UsageError
from fedcore.results.plot import chosen_metrics, labels, save_figure
from fedcore.results.reading import read_run

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "examples" / "quickstart-numpy")
FEDCORE = Path(sys.executable).parent / "fedcore"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two quickstart runs that differ in seed and learning rate."""
    parent = tmp_path_factory.mktemp("runs")
    made = []
    for seed, rate in ((0, 0.1), (1, 0.3)):
        result = fc.run_simulation(QUICKSTART, nodes=10, seed=seed, backend="inline",
                                   run_config=f"num-server-rounds=3 learning-rate={rate}",
                                   progress=False, out=parent)  # fmt: skip
        assert result.out is not None
        made.append(result.out)
    return made


def plot(*args: str, cwd: Path, python: str = "") -> subprocess.CompletedProcess[str]:
    command = [str(FEDCORE), "plot", *args]
    if python:  # the command run by a Python that first does `python`
        command = [sys.executable, "-c", f"{python}; from fedcore.cli import main; main()",
                   "plot", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd,
                          check=False)  # fmt: skip


def test_runs_are_labelled_by_what_differs_between_them(two_runs: list[Path]) -> None:
    runs = [read_run(path) for path in two_runs]
    assert labels(runs) == ["seed=0, learning-rate=0.1", "seed=1, learning-rate=0.3"]
    assert labels(runs[:1]) == ["quickstart-numpy"]
    assert chosen_metrics(runs, ["accuracy"]) == ["server.accuracy", "evaluate.accuracy"]
    assert chosen_metrics(runs, ["train.loss"]) == ["train.loss"]
    with pytest.raises(UsageError, match="no run has a metric 'f1'"):
        chosen_metrics(runs, ["f1"])
    rounds, values = runs[0].series("server.accuracy")
    assert rounds == [1, 2, 3]
    assert all(0.0 <= value <= 1.0 for value in values)


def test_a_picture_of_several_runs(two_runs: list[Path], tmp_path: Path) -> None:
    done = plot(*map(str, two_runs), "--metric", "accuracy", "-o", "acc.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "acc.png").read_bytes()[:8] == PNG
    default = plot(str(two_runs[0]), cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert (tmp_path / "plot.png").read_bytes()[:8] == PNG


def test_a_text_chart_when_asked_or_without_matplotlib(
    two_runs: list[Path], tmp_path: Path
) -> None:
    asked = plot(*map(str, two_runs), "--terminal", "-m", "server.accuracy", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.startswith("server.accuracy\n")
    assert "* seed=0, learning-rate=0.1  o seed=1, learning-rate=0.3" in asked.stdout
    chart = asked.stdout.splitlines()[1:13]
    assert {"*", "o"} <= set("".join(chart))

    without = plot(str(two_runs[0]), cwd=tmp_path,
                   python="import sys; sys.modules['matplotlib'] = None")  # fmt: skip
    assert without.returncode == 0, without.stderr
    assert "matplotlib is not installed" in without.stderr
    assert "server.accuracy" in without.stdout
    assert not (tmp_path / "plot.png").exists()


def test_what_is_not_a_results_directory_is_one_line(tmp_path: Path) -> None:
    done = plot(str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"error: {str(tmp_path)!r} is not a results directory: it has no run.json"
    )


def _another_apps_run(run: Path, parent: Path) -> Path:
    """``run``'s record as if another app, with a run config of its own, had made it."""
    other = parent / "other-app-run"
    shutil.copytree(run, other)
    document = json.loads((other / "run.json").read_text())
    document.update(app="other-app", config={"alpha": 0.5, "rounds-per-epoch": 2})
    (other / "run.json").write_text(json.dumps(document))
    return other


def test_runs_of_two_apps_are_labelled_by_their_apps_in_a_legend_below_the_panels(
    two_runs: list[Path], tmp_path: Path
) -> None:
    other = _another_apps_run(two_runs[0], tmp_path)
    runs = [read_run(two_runs[0]), read_run(other)]

    assert labels(runs) == ["quickstart-numpy", "other-app"]
    assert labels([read_run(two_runs[1]), read_run(other)]) == [
        "quickstart-numpy, seed=1",
        "other-app, seed=0",
    ]
    assert labels([runs[0], read_run(two_runs[0])]) == [two_runs[0].name] * 2

    picture = save_figure(runs, ["server.accuracy"], tmp_path / "two-apps.png")
    width, height = struct.unpack(">II", picture.read_bytes()[16:24])
    panel = (4.2 * 110, 3.2 * 110)  # one panel at the figure's size and dpi
    assert height > panel[1] + 20  # the legend's lines are drawn under the panel, not on it
    assert width <= panel[0] + 20
