"""``fedcore run --stream`` follows a run to its end as a user watches it: across a link
that is killed and restarted under it, and into a ServerApp's failure.

A link and two nodes on loopback, runs of ``record_app`` (every round adds one to the
model; ``fail-at-end`` makes ``main`` raise once its rounds are done).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import FEDCORE, Deployment, run_config_text

RECORD_APP = Path(__file__).resolve().parent / "record_app"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(tmp_path_factory.mktemp("follow")) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        yield deployment


def _stream(deployment: Deployment, out: Path, **config: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FEDCORE), "run", str(RECORD_APP), "--stream", "--out", str(out),
         "--run-config", run_config_text(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=deployment.cli_environment(),
        cwd=deployment.root,
    )  # fmt: skip


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _pulled(deployment: Deployment, run_id: str, directory: Path) -> Path:
    done = deployment.fedcore("pull", run_id, str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def test_a_stream_waits_for_a_restarted_link_and_keeps_the_record_whole(
    deployment: Deployment, tmp_path: Path
) -> None:
    rounds = 6
    process = _stream(deployment, tmp_path / "results", rounds=rounds, **{"train-seconds": 0.4})
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:  # round 2 is done: the run is well under way
            printed.append(line)
            if f"round 2/{rounds}" in line:
                break
        assert deployment.link is not None
        deployment.kill(deployment.link)
        time.sleep(1.0)  # the link stays away a while, as a restart by hand does
        deployment.restart_link()
        out, err = _finish(process)
    finally:
        if process.poll() is None:
            process.kill()
    out = "".join(printed) + out

    assert process.returncode == 0, err
    assert "Traceback" not in out + err
    assert "following again once it is back" in err
    assert "the link is back: following the run again" in err
    run_id = re.search(r"run (\d+) submitted", out).group(1)  # type: ignore[union-attr]
    (streamed,) = (tmp_path / "results").iterdir()
    pulled = _pulled(deployment, run_id, tmp_path / "pulled")
    for name in ("metrics.jsonl", "log.txt"):  # every line once, as the link holds them
        assert (streamed / name).read_text() == (pulled / name).read_text(), name
    rows = [json.loads(line) for line in (streamed / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows if "round" in row] == list(range(1, rounds + 1))
    assert json.loads((streamed / "run.json").read_text())["status"] == "completed"


def test_a_streamed_failure_keeps_the_whole_traceback_in_the_record(
    deployment: Deployment, tmp_path: Path
) -> None:
    process = _stream(deployment, tmp_path / "results", rounds=1, **{"fail-at-end": True})
    out, err = _finish(process)

    assert process.returncode == 1, err
    run_id = re.search(r"run (\d+) submitted", out).group(1)  # type: ignore[union-attr]
    (streamed,) = (tmp_path / "results").iterdir()
    kept = (streamed / "log.txt").read_text()
    assert "RuntimeError: main was told to fail at its end" in kept
    logged = deployment.fedcore("log", run_id)
    assert logged.returncode == 0, logged.stderr
    shown = [line for line in logged.stdout.splitlines() if line.strip()]
    assert len([line for line in shown if "File " in line]) >= 1
    for line in shown:  # what `fedcore log` shows later, the stream kept as it went
        assert line.split(" ", 1)[-1] in kept, line
    assert (streamed / "log.txt").read_text() == (
        _pulled(deployment, run_id, tmp_path / "pulled") / "log.txt"
    ).read_text()
    run = json.loads((streamed / "run.json").read_text())
    assert run["status"] == "failed"
    assert run["error"] == "RuntimeError: main was told to fail at its end"
