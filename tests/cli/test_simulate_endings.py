"""How a simulation ends, run as a user runs it: the exit status when nothing trained, a
hung ClientApp on the process backend, and progress shown from Python."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.simulation.progress import summary
from fedcore.strategy.result import RoundReport

FEDCORE = Path(sys.executable).parent / "fedcore"

APPS = """\
import os
import time

import numpy as np

import fedcore as fc
from fedcore.strategy import FedAvg

failing, hanging = fc.ClientApp(), fc.ClientApp()


@failing.train()
def fail(msg, context):
    raise RuntimeError("no data here")


@hanging.train()
def train(msg, context):
    if context.node_config["partition-id"] == 0:
        time.sleep(3600)
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(fc.RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}),
                      reply_to=msg)


server = fc.ServerApp()


@server.main()
async def main(grid, context):
    await FedAvg(fraction_evaluate=0.0, min_available_nodes=3).start(
        grid=grid, initial_arrays=fc.ArrayRecord({"w": np.zeros(2)}), num_rounds=2)


fails = fc.App(server=server, client=failing)
hangs = fc.App(server=server, client=hanging)

busy = fc.ClientApp()


@busy.train()
def work(msg, context):
    import torch  # its C++ threads are what an exit under a running handler aborts

    print(f"working {context.node_config['partition-id']}", flush=True)
    model, data = torch.nn.Linear(64, 64), torch.randn(512, 64)
    deadline = time.monotonic() + msg.content["config"]["seconds"]
    while True:
        model(data).sum().backward()
        if time.monotonic() >= deadline:
            break
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord({"n": 1})}), reply_to=msg)


def _work(nodes, seconds):
    config = fc.ConfigRecord({"seconds": seconds})
    return [fc.Message(fc.RecordDict({"config": config}), node, "train") for node in nodes]


pushing, leaving = fc.ServerApp(), fc.ServerApp()


@pushing.main()
async def push_and_end(grid, context):
    # As Flower's vertical-fl ends: a round, then a push whose replies nobody pulls.
    nodes = await grid.wait_for_nodes(3)
    replies = await grid.send_and_receive(_work(nodes, 0.0))
    assert len(replies) == 3 and not any(reply.has_error() for reply in replies)
    await grid.push_messages(_work(nodes, 1.0))
    print("pushed", flush=True)


@leaving.main()
async def leave_them_working(grid, context):
    # ClientApps that need longer than the ServerApp waits for them.
    nodes = await grid.wait_for_nodes(3)
    wait = context.run_config.get("wait", 2.0)
    replies = await grid.send_and_receive(_work(nodes, 60.0), timeout=wait)
    print(f"left {3 - len(replies)} working", flush=True)


push_last = fc.App(server=pushing, client=busy)
slow = fc.App(server=leaving, client=busy)

steady, broken = fc.ClientApp(), fc.ServerApp()


@steady.train()
def step(msg, context):
    if os.environ.get("STALL_IN_ROUND") == str(msg.content["config"]["server-round"]):
        print("stalled", flush=True)
        time.sleep(3600)
    arrays = fc.ArrayRecord({"w": msg.content["arrays"]["w"].numpy() + 1})
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(fc.RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@broken.main()
async def one_round_then_raise(grid, context):
    await FedAvg(fraction_evaluate=0.0, min_available_nodes=3).start(
        grid=grid, initial_arrays=fc.ArrayRecord({"w": np.zeros(2)}), num_rounds=1)
    raise ValueError("the server broke")


longer = fc.ServerApp()


@longer.main()
async def three_rounds(grid, context):
    await FedAvg(fraction_evaluate=0.0, min_available_nodes=3).start(
        grid=grid, initial_arrays=fc.ArrayRecord({"w": np.zeros(2)}), num_rounds=3)


three = fc.App(server=longer, client=steady)
breaks = fc.App(server=broken, client=steady)
"""

BACKENDS = ["inline", "process", pytest.param("ray", marks=pytest.mark.ray)]
IN_FLIGHT = "the run ended with messages in flight to 3 nodes"


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    (tmp_path / "ending_apps.py").write_text(APPS)
    return tmp_path


def _fedcore(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_a_run_whose_last_round_trained_nothing_exits_1_with_the_codes(apps: Path) -> None:
    options = ["-n", "3", "--backend", "inline", "--seed", "0", "--out", "results"]
    done = _fedcore(apps, "ending_apps:fails", *options)

    assert done.returncode == 1, done.stderr
    reason = "the last round (2/2) had no successful training reply: 3 failures (code 2 ×3)"
    assert done.stderr.splitlines()[-1] == f"error: {reason}"
    assert "· 6 failures (code 2 ×6) ·" in done.stdout.splitlines()[-1]
    (record,) = (apps / "results").iterdir()
    run = json.loads((record / "run.json").read_text())
    assert (run["status"], run["error"]) == ("failed", reason)  # as the exit status says
    assert f"results: results/{record.name}" in done.stderr


def test_a_serverapp_that_raises_says_where_its_record_is_and_how_to_go_on(
    apps: Path,
) -> None:
    done = _fedcore(
        apps, "ending_apps:breaks", "-n", "3", "--backend", "inline", "--out", "results"
    )

    assert done.returncode == 1
    (record,) = (apps / "results").iterdir()
    where = f"results/{record.name}"
    assert done.stderr.splitlines()[-2:] == [
        "ValueError: the server broke",
        f"results: {where} (go on from its last finished round: fedcore simulate --resume {where})",
    ]
    run = json.loads((record / "run.json").read_text())
    assert (run["status"], run["error"]) == ("failed", "ValueError: the server broke")


def test_ctrl_c_after_a_round_says_how_to_resume_and_the_resumed_run_completes(
    apps: Path,
) -> None:
    command = [str(FEDCORE), "simulate", "ending_apps:three", "-n", "3", "--backend", "inline"]
    command += ["--out", "results"]
    process = subprocess.Popen(
        command,
        cwd=apps,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STALL_IN_ROUND": "2"},
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # round 1 is done and checkpointed: round 2 stalls
            if line.startswith("stalled"):
                break
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 130, err
    (record,) = (apps / "results").iterdir()
    where = f"results/{record.name}"
    hint = f"fedcore simulate --resume {where}"
    assert f"interrupted; results: {where} (go on from its last finished round: {hint})" in err
    assert json.loads((record / "run.json").read_text())["status"] == "interrupted"

    resumed = _fedcore(apps, "--resume", where)

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((record / "run.json").read_text())["status"] == "completed"
    assert "round 3/3: 3 replies, 0 failures" in resumed.stderr


def test_a_hung_clientapp_on_the_process_backend_times_out_and_the_run_goes_on(
    apps: Path,
) -> None:
    # Four workers (half a CPU each): while one is stuck, the healthy nodes have others.
    # The run ends as the stuck worker's replacement starts: it leaves without a word.
    options = ["-n", "3", "--seed", "0", "--num-cpus", "0.5", "--round-timeout", "3"]
    done = _fedcore(apps, "ending_apps:hangs", *options)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    totals = done.stdout.splitlines()[-1]
    assert totals.startswith("2 rounds · 4 replies (4 train, 0 evaluate) · 2 failures (code 3 ×2)")
    assert "round 2/2: 2 replies, 1 failures" in done.stderr


def test_a_hung_plain_handler_on_the_inline_backend_does_not_keep_the_process(
    apps: Path,
) -> None:
    # The abandoned handler's thread still sleeps when the run ends: the process exits
    # all the same, at once (a non-daemon thread would hold it for the hour).
    options = ["-n", "3", "--seed", "0", "--backend", "inline", "--round-timeout", "1"]
    done = _fedcore(apps, "ending_apps:hangs", *options)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    totals = done.stdout.splitlines()[-1]
    assert totals.startswith("2 rounds · 4 replies (4 train, 0 evaluate) · 2 failures (code 3 ×2)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_whose_main_ends_with_a_push_it_never_pulls_ends_cleanly(
    apps: Path, backend: str
) -> None:
    done = _fedcore(apps, "ending_apps:push_last", "-n", "3", "--backend", backend)

    assert done.returncode == 0, done.stderr
    assert "pushed" in done.stdout
    output = done.stdout + done.stderr
    assert "Traceback" not in output
    assert "terminate called" not in output
    assert output.count("the run ended with messages in flight") <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_clientapps_still_running_when_the_run_ends_are_stopped_and_reported_once(
    apps: Path, backend: str
) -> None:
    # Their handlers run torch for a minute: the inline backend waits for them a while,
    # then the process ends without an exit that would abort it under them.
    done = _fedcore(apps, "ending_apps:slow", "-n", "3", "--backend", backend)

    assert done.returncode == 0, done.stderr
    assert "left 3 working" in done.stdout
    output = done.stdout + done.stderr
    assert "Traceback" not in output
    assert "terminate called" not in output
    assert output.count(IN_FLIGHT) == 1


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_ctrl_c_while_clientapps_run_ends_the_run_cleanly(apps: Path, backend: str) -> None:
    command = [str(FEDCORE), "simulate", "ending_apps:slow", "-n", "3", "--backend", backend]
    command += ["--run-config", "wait=120.0"]  # the ServerApp waits: the signal ends the run
    process = subprocess.Popen(
        command, cwd=apps, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the first ClientApp at work: the run is under way
            if line.startswith("working"):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 130, err
    assert "Traceback" not in out + err
    assert "terminate called" not in out + err


def test_round_timeout_must_be_positive(apps: Path) -> None:
    done = _fedcore(apps, "ending_apps:hangs", "-n", "3", "--round-timeout", "0")

    assert done.returncode == 2
    assert "--round-timeout" in done.stderr


SCRIPT = """\
import logging
import sys

import fedcore as fc
from ending_apps import fails

mode = sys.argv[1]
if mode == "configured":
    logging.basicConfig(level=logging.WARNING)
fc.run_simulation(fails, nodes=3, backend="inline", seed=0, progress=mode != "off")
print("done")
"""


@pytest.mark.parametrize("mode", ["default", "configured", "off"])
def test_run_simulation_from_python_shows_rounds_and_summary_unless_told_not_to(
    apps: Path, mode: str
) -> None:
    (apps / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "script.py", mode],
        cwd=apps,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    if mode == "default":
        assert "round 1/2: 0 replies, 3 failures" in done.stderr
        assert "round 2/2: 0 replies, 3 failures" in done.stderr
        assert done.stdout.splitlines()[-2].startswith(
            "2 rounds · 0 replies (0 train, 0 evaluate) · 6 failures (code 2 ×6)"
        )
    else:
        assert "round 1/2" not in done.stderr
        assert done.stdout == "done\n"


def test_the_summary_names_the_rounds_it_leaves_out() -> None:
    reports = [RoundReport(r, 30, 2, 1, 0.1, {"code 2": 1}) for r in range(1, 31)]

    lines = summary(reports, 3.0, 0).splitlines()

    shown = [int(line.split()[0]) for line in lines[1:-1] if not line.lstrip().startswith("⋮")]
    gaps = [line.split()[2] for line in lines[1:-1] if line.lstrip().startswith("⋮")]
    covered = set(shown)
    for gap in gaps:
        first, _, last = gap.partition("–")
        covered |= set(range(int(first), int(last or first) + 1))
    assert covered == set(range(1, 31))
    assert shown[0] == 1
    assert shown[-1] == 30
    assert lines[-1].startswith("30 rounds · 90 replies (60 train, 30 evaluate) · ")
    assert "30 failures (code 2 ×30)" in lines[-1]
