"""A simulation SIGKILLed in round 3, 7 or 10 of 12 and resumed with ``fedcore simulate
--resume DIR`` ends with the uninterrupted run's model, bit for bit: whole processes.

The app (``resume_app/``) pauses the run it is told to (once) inside round K's server
evaluation and says so in a file, so the kill lands in round K on any machine; the
whole process group goes (the process backend's workers with it). Three runs: FedAvg
on the process backend, FedAdam (server moments in the strategy's state), and FedAvg
over ClientApps that keep a velocity in ``context.state`` (the nodes' contexts in the
checkpoint).
"""

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

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).resolve().parent / "resume_app"
FEDCORE = Path(sys.executable).parent / "fedcore"
WAIT = 90.0

CASES = {
    "fedavg": (("--backend", "process", "--max-workers", "2"), ""),
    "fedadam": (("--backend", "inline"), 'strategy="fedadam"'),
    "client-state": (("--backend", "inline"), "client-state=true"),
    "fedbuff": (("--backend", "inline"), 'strategy="fedbuff"'),
}
COMPARED = ["fedavg", "fedadam", "client-state"]
"""The cases whose resumed model must be the uninterrupted one's (FedBuff's depends on
timing)."""


def simulate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=cwd,
        check=False,
    )


def start(case: str, out: Path, pause: str = "") -> list[str]:
    """The command line of ``case``'s run; ``pause``: run-config keys that stop it once."""
    flags, config = CASES[case]
    config = " ".join(filter(None, (config, pause)))
    return [str(APP), "--seed", "5", "--out", str(out), "-q", *flags, "--run-config", config]


def only_run(parent: Path) -> Path:
    [run] = list(parent.iterdir())
    return run


def model(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "model.npz") as saved:
        return {name: saved[name] for name in saved.files}


def run_killed_in(case: str, kill_round: int, out: Path, cwd: Path) -> Path:
    """Start the run, SIGKILL its whole process group once it is inside ``kill_round``."""
    paused = cwd / f"paused-{case}-{kill_round}"
    pause = f'pause-round={kill_round} pause-file="{paused}"'
    process = subprocess.Popen(
        [str(FEDCORE), "simulate", *start(case, out, pause)],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not paused.exists():
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, f"the run never reached round {kill_round}"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    return only_run(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    """Each case's model from a run nobody interrupted."""
    models = {}
    for case in COMPARED:
        work = tmp_path_factory.mktemp(f"whole-{case}")
        done = simulate(*start(case, work / "out"), cwd=work)
        assert done.returncode == 0, done.stderr
        models[case] = model(only_run(work / "out"))
    return models


@pytest.mark.parametrize("kill_round", [3, 7, 10])
@pytest.mark.parametrize("case", COMPARED)
def test_a_run_killed_mid_round_and_resumed_ends_with_the_uninterrupted_model(
    case: str, kill_round: int, uninterrupted: dict[str, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    run_dir = run_killed_in(case, kill_round, tmp_path / "out", tmp_path)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "running"  # killed: it never said how it ended
    assert not (run_dir / "model.npz").exists()

    resumed = simulate("--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr

    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    # The kill came inside round K, before its checkpoint: the run went on after K − 1.
    assert [r["after_round"] for r in record["resumed"]] == [kill_round - 1]
    final = model(run_dir)
    expected = uninterrupted[case]
    assert final.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(final[name], array)
    rounds = [
        row["round"]
        for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if "round" in row
    ]
    assert rounds == list(range(1, 13))  # every round once
    assert not (run_dir / "checkpoint.bin").exists()  # completed: its model is in model.npz


def test_a_fedbuff_run_killed_at_its_step_7_goes_on_from_step_6(tmp_path: Path) -> None:
    """FedBuff checkpoints each server step; which replies share a buffer depends on
    timing, so the model is not compared, only that every step is done once."""
    run_dir = run_killed_in("fedbuff", 7, tmp_path / "out", tmp_path)
    resumed = simulate("--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["resumed"][0]["after_round"]) == ("completed", 6)
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    assert [row["round"] for row in rows if "round" in row] == list(range(1, 13))
    assert "resuming after round 6 of 12" in (run_dir / "log.txt").read_text()


def test_the_nodes_contexts_change_the_model(
    uninterrupted: dict[str, dict[str, np.ndarray]],
) -> None:
    """What makes the client-state case able to fail: without the velocities kept in
    the nodes' contexts the run ends elsewhere (and FedAdam's moments elsewhere too)."""
    assert not np.array_equal(uninterrupted["client-state"]["w"], uninterrupted["fedavg"]["w"])
    assert not np.array_equal(uninterrupted["fedadam"]["w"], uninterrupted["fedavg"]["w"])


def test_a_resume_that_would_be_another_run_is_refused(tmp_path: Path) -> None:
    run_dir = run_killed_in("fedadam", 2, tmp_path / "out", tmp_path)
    for extra, says in [
        (("--seed", "6"), "a resumed run keeps the seed it was started with"),
        (("--nodes", "4"), "a resumed run keeps the nodes it was started with"),
        (("--out", str(tmp_path)), "a resumed run keeps its record in DIR"),
        (("--track", "tensorboard"), "does not take trackers yet"),
    ]:
        refused = simulate("--resume", str(run_dir), *extra, cwd=tmp_path)
        assert refused.returncode != 0
        assert says in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    missing = simulate(cwd=tmp_path)
    assert missing.returncode == 2
    assert "Missing argument 'TARGET' (or --resume DIR)" in missing.stderr
