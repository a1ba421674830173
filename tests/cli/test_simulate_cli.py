"""``fedcore simulate``: flags, one-line errors, metrics files, determinism, and a real run."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import fedcore
from fedcore.cli import cli, main

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "examples" / "quickstart-numpy")
FEDCORE = Path(sys.executable).parent / "fedcore"
ROUND_FIELDS = {
    "round",
    "num_rounds",
    "replies",
    "failures",
    "failures_by_label",
    "elapsed",
    "train",
    "evaluate",
    "server",
}

TINY_APPS = """\
import json

import fedcore as fc

client = fc.ClientApp()


def _main_printing_config():
    server = fc.ServerApp()

    @server.main()
    async def main(grid, context):
        print("run config:", json.dumps(context.run_config, sort_keys=True))

    return server


def _main_raising():
    server = fc.ServerApp()

    @server.main()
    def main(grid, context):
        raise ValueError("the author's bug")

    return server


echo_config = fc.App(server=_main_printing_config(), client=client)
boom = fc.App(server=_main_raising(), client=client)
"""


@dataclass
class Outcome:
    """What ``fedcore`` (the console script's ``main``) did: exit status and output."""

    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


RunMain = Callable[..., Outcome]
Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a target puts its directory on sys.path; undo that after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    importlib.invalidate_caches()


@pytest.fixture
def tiny_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A uniquely named module of tiny apps in the current directory; returns its name."""
    name = f"fccli_apps_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(TINY_APPS)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def invoke() -> Invoke:
    """Run the click group in-process, with stdout and stderr kept apart."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(cli, list(args), prog_name="fedcore")

    return run


@pytest.fixture
def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> RunMain:
    """Run the console script's entry point, which turns errors into exit statuses."""

    def run(*args: str) -> Outcome:
        monkeypatch.setattr(sys, "argv", ["fedcore", *args])
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return run


def quickstart(invoke: Invoke, *options: str, rounds: int = 2, nodes: int = 10) -> Result:
    result = invoke(
        "simulate",
        QUICKSTART,
        "--nodes",
        str(nodes),
        "--run-config",
        f"num-server-rounds={rounds}",
        *options,
    )
    assert result.exit_code == 0, result.output
    return result


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The per-round lines (each run's header line has a "run" key instead of "round")."""
    return [row for row in read_lines(path) if "run" not in row]


def without_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in row.items() if key != "elapsed"} for row in rows]


def assert_one_line_error(outcome: Outcome, *fragments: str) -> str:
    assert outcome.code == 2
    assert outcome.out == ""
    assert "Traceback" not in outcome.err
    [line] = outcome.err_lines
    assert line.startswith("error: ")
    for fragment in fragments:
        assert fragment in line
    return line


# ------------------------------------------------------------------ help


def test_help_explains_target_and_options(invoke: Invoke) -> None:
    result = invoke("simulate", "--help")

    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # undo click's line wrapping
    assert "Usage: fedcore simulate [OPTIONS] [TARGET]" in text
    assert "TARGET is an app directory whose pyproject.toml has a [tool.fedcore.app] table" in text
    assert '"module:attr" naming a fedcore.App importable from the current directory' in text
    for option in ("--nodes", "--backend", "--run-config", "--seed", "--metrics-out", "--quiet"):
        assert option in text
    assert "fedcore simulate examples/quickstart-numpy --nodes 100 --seed 0" in text


def test_the_group_help_lists_simulate(invoke: Invoke) -> None:
    result = invoke("--help")

    assert result.exit_code == 0
    assert "simulate  Simulate TARGET on --nodes virtual nodes on this machine." in result.stdout


def test_version_is_printed(invoke: Invoke) -> None:
    result = invoke("--version")

    assert result.exit_code == 0
    assert result.stdout == f"fedcore, version {fedcore.__version__}\n"


# ------------------------------------------------------------------ usage errors: one line, exit 2


def test_zero_nodes_is_one_clear_line(run_main: RunMain) -> None:
    line = assert_one_line_error(run_main("simulate", QUICKSTART, "--nodes", "0"))

    assert line == (
        "error: Invalid value for --nodes: must be at least 1, got 0 "
        "(see 'fedcore simulate --help')"
    )


def test_missing_nodes_is_one_clear_line(run_main: RunMain) -> None:
    # The quickstart declares no node count, so there is none to default to.
    line = assert_one_line_error(run_main("simulate", QUICKSTART))

    assert line == (
        "error: how many nodes to simulate? pass --nodes N (nodes=N), or declare it in the "
        "app's pyproject.toml: nodes = N under [tool.fedcore.app.simulation], or "
        "options.num-supernodes = N in a [tool.flwr.federations] entry"
    )


def test_a_negative_seed_is_one_clear_line(run_main: RunMain) -> None:
    assert_one_line_error(
        run_main("simulate", QUICKSTART, "-n", "2", "--seed", "-1"), "--seed", "-1"
    )


def test_an_unknown_backend_is_one_clear_line(run_main: RunMain) -> None:
    assert_one_line_error(
        run_main("simulate", QUICKSTART, "-n", "2", "--backend", "warp"), "--backend", "'warp'"
    )


def test_an_unknown_target_is_one_line(tmp_path: Path, run_main: RunMain) -> None:
    line = assert_one_line_error(run_main("simulate", str(tmp_path / "nowhere"), "-n", "2"))

    assert line.startswith(f"error: '{tmp_path / 'nowhere'}' is neither an app directory")


def test_a_missing_module_target_is_one_line(
    run_main: RunMain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # fedcore's own files are importable from here: never blamed
    line = assert_one_line_error(run_main("simulate", "fccli_no_such_module:app", "-n", "2"))

    assert line == (
        "error: cannot load App 'fccli_no_such_module:app': "
        "ModuleNotFoundError: No module named 'fccli_no_such_module'"
    )


def test_an_undeclared_run_config_key_names_it_and_the_declared_keys(run_main: RunMain) -> None:
    outcome = run_main("simulate", QUICKSTART, "-n", "2", "--run-config", "num-rounds=3")

    assert_one_line_error(
        outcome,
        "unknown run-config key 'num-rounds'",
        "batch-size, dirichlet-alpha, fraction-evaluate, fraction-train, learning-rate, "
        "local-epochs, num-server-rounds, seed",
    )


def test_a_run_config_value_of_the_wrong_type_is_one_line(run_main: RunMain) -> None:
    outcome = run_main("simulate", QUICKSTART, "-n", "2", "--run-config", "num-server-rounds=0.5")

    assert_one_line_error(outcome, "run-config num-server-rounds expects int (default 30), got 0.5")


def test_a_malformed_run_config_is_one_line(run_main: RunMain) -> None:
    outcome = run_main("simulate", QUICKSTART, "-n", "2", "--run-config", "num-server-rounds")

    assert_one_line_error(outcome, "--run-config", "look like key=value")


def test_an_unwritable_metrics_file_is_one_line(tmp_path: Path, run_main: RunMain) -> None:
    target = tmp_path / "missing-dir" / "metrics.jsonl"

    outcome = run_main("simulate", QUICKSTART, "-n", "2", "--metrics-out", str(target))

    assert_one_line_error(outcome, "--metrics-out", "its directory does not exist")


# ------------------------------------------------------------------ module:attr targets


def test_a_module_attr_target_accepts_any_run_config_key(tiny_apps: str, invoke: Invoke) -> None:
    result = invoke(
        "simulate",
        f"{tiny_apps}:echo_config",
        "-n",
        "2",
        "--seed",
        "1",
        "--run-config",
        'anything=1 other="two words"',
        "--run-config",
        "flag=true",
    )

    assert result.exit_code == 0, result.output
    config = {"anything": 1, "flag": True, "other": "two words"}
    assert f"run config: {json.dumps(config, sort_keys=True)}" in result.stdout


def test_a_run_without_rounds_still_prints_a_summary(tiny_apps: str, invoke: Invoke) -> None:
    result = invoke("simulate", f"{tiny_apps}:echo_config", "-n", "2", "--seed", "5")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("no rounds reported · ")
    assert result.stdout.rstrip().endswith("seed 5")


def test_without_a_seed_the_random_seed_is_printed(tiny_apps: str, invoke: Invoke) -> None:
    result = invoke("simulate", f"{tiny_apps}:echo_config", "-n", "2")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].rsplit(" · ", 1)[-1].removeprefix("seed ").isdigit()


def test_an_exception_in_main_shows_the_authors_frames(tiny_apps: str, run_main: RunMain) -> None:
    outcome = run_main("simulate", f"{tiny_apps}:boom", "-n", "2")

    assert outcome.code == 1
    assert "Traceback (most recent call last; " in outcome.err
    assert "frames of fedcore and libraries hidden" in outcome.err
    assert f"{tiny_apps}.py" in outcome.err
    assert 'raise ValueError("the author\'s bug")' in outcome.err
    error, where = outcome.err.rstrip().splitlines()[-2:]
    assert error == "ValueError: the author's bug"
    assert where.startswith("results: ")  # no round finished: nothing to resume
    assert "--resume" not in where
    assert "anyio" not in outcome.err
    assert "fedcore/simulation" not in outcome.err


def test_an_exception_in_main_is_a_non_zero_exit(tiny_apps: str, invoke: Invoke) -> None:
    result = invoke("simulate", f"{tiny_apps}:boom", "-n", "2")

    assert result.exit_code != 0
    assert isinstance(result.exception, ValueError)


# ------------------------------------------------------------------ metrics, quiet, determinism


def test_metrics_out_writes_one_json_line_per_round(tmp_path: Path, invoke: Invoke) -> None:
    metrics = tmp_path / "run.jsonl"

    quickstart(invoke, "--seed", "0", "--metrics-out", str(metrics))

    header, *rows = read_lines(metrics)
    assert set(header) == {"run", "seed", "config", "started", "fedcore"}
    assert header["seed"] == 0
    assert header["config"]["num-server-rounds"] == 2
    assert header["fedcore"] == fedcore.__version__
    assert header["started"].endswith("+00:00")
    assert [row["round"] for row in rows] == [1, 2]
    for row in rows:
        assert set(row) == ROUND_FIELDS
        assert row["num_rounds"] == 2
        assert row["replies"] == 4  # 2 train + 2 evaluate: FedAvg's minimum of 10 nodes
        assert row["failures"] == 0
        assert set(row["train"]) == {"loss"}
        assert set(row["evaluate"]) == {"loss", "accuracy"}
        assert set(row["server"]) == {"loss", "accuracy"}


def test_metrics_out_appends_to_an_existing_file(tmp_path: Path, invoke: Invoke) -> None:
    metrics = tmp_path / "run.jsonl"
    metrics.write_text('{"round": 0}\n')

    quickstart(invoke, "--seed", "0", "--metrics-out", str(metrics), rounds=1)
    quickstart(invoke, "--seed", "1", "--metrics-out", str(metrics), rounds=1)

    lines = read_lines(metrics)
    assert [row.get("round") for row in lines] == [0, None, 1, None, 1]
    assert [lines[1]["seed"], lines[3]["seed"]] == [0, 1]
    assert lines[1]["run"] != lines[3]["run"]


def test_the_same_seed_gives_the_same_metrics(tmp_path: Path, invoke: Invoke) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"

    quickstart(invoke, "--seed", "0", "--metrics-out", str(first))
    quickstart(invoke, "--seed", "0", "--metrics-out", str(second))

    # Everything but the wall-clock time per round must match exactly.
    assert without_timing(read_rows(first)) == without_timing(read_rows(second))


def test_another_seed_gives_other_metrics(tmp_path: Path, invoke: Invoke) -> None:
    first, second = tmp_path / "seed0.jsonl", tmp_path / "seed1.jsonl"

    quickstart(invoke, "--seed", "0", "--metrics-out", str(first))
    quickstart(invoke, "--seed", "1", "--metrics-out", str(second))

    assert without_timing(read_rows(first)) != without_timing(read_rows(second))


def test_quiet_hides_logs_but_keeps_metrics_and_summary(tmp_path: Path, invoke: Invoke) -> None:
    metrics = tmp_path / "run.jsonl"

    result = quickstart(invoke, "--seed", "0", "--quiet", "--metrics-out", str(metrics))

    assert "round 1/2" not in result.stderr
    assert "INFO" not in result.stderr
    assert len(read_rows(metrics)) == 2
    assert "2 rounds · 8 replies (4 train, 4 evaluate) · 0 failures · " in result.stdout
    assert result.stdout.rstrip().endswith("seed 0")


def test_without_quiet_each_round_is_logged(invoke: Invoke) -> None:
    result = quickstart(invoke, "--seed", "0")

    assert "round 1/2: 4 replies, 0 failures" in result.stderr
    assert "round 2/2: 4 replies, 0 failures" in result.stderr


def test_the_summary_table_shows_each_round(invoke: Invoke) -> None:
    result = quickstart(invoke, "--seed", "0")

    header, *rows, totals = result.stdout.splitlines()
    assert header.split()[:5] == ["round", "train", "evaluate", "failed", "time"]
    assert "server accuracy" in header
    assert [row.split()[:4] for row in rows] == [["1", "2", "2", "0"], ["2", "2", "2", "0"]]
    assert totals.startswith("2 rounds · 8 replies (4 train, 4 evaluate) · 0 failures · ")


# ------------------------------------------------------------------ the real console script


def test_the_console_script_runs_the_quickstart() -> None:
    completed = subprocess.run(
        [
            str(FEDCORE),
            "simulate",
            "examples/quickstart-numpy",
            "--nodes",
            "100",
            "--seed",
            "0",
            "--run-config",
            "num-server-rounds=3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr
    assert completed.stdout.splitlines()[-1].startswith(
        "3 rounds · 60 replies (30 train, 30 evaluate) · 0 failures · "
    )
    assert completed.stdout.rstrip().endswith("seed 0")
    round_lines = [line for line in completed.stderr.splitlines() if "server accuracy=" in line]
    assert [line.split("INFO")[1].split(":")[0].strip() for line in round_lines] == [
        "round 1/3",
        "round 2/3",
        "round 3/3",
    ]


def test_a_run_that_fails_to_start_leaves_no_metrics_file(
    tmp_path: Path, run_main: RunMain
) -> None:
    target = tmp_path / "metrics.jsonl"

    outcome = run_main("simulate", "no_such_module:app", "-n", "2", "--metrics-out", str(target))

    assert_one_line_error(outcome, "no_such_module")
    assert not target.exists()
