"""The README's "on one machine" deployment, as written there, and what it guards against.

The lines start a link and three nodes, each with the partition its ClientApp reads;
without one, every message fails, and the run must say so rather than complete.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.deployment import Deployment
from fedcore.testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"
ROUNDS = "num-server-rounds=2 fraction-train=1.0 fraction-evaluate=1.0"

pytestmark = pytest.mark.timeout(180)


def readme_nodes() -> list[str]:
    """The ``--node-config`` of each node the README's one-machine lines start."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("On one machine, for a try") :]
    block = block[: block.index("```", block.index("```sh") + 5)]
    (indices,) = re.findall(r"for i in ([\d ]+); do", block)
    (config,) = re.findall(r'--node-config "([^"]+)"', block)
    assert "$i" in config, "each node of the README's loop needs its own partition"
    return [config.replace("$i", index) for index in indices.split()]


def test_the_readmes_one_machine_lines_run_the_example(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for node_config in readme_nodes():
            federation.start_node(node_config)
        done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", ROUNDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KeyError" not in done.stdout
    assert re.search(r"round 2/2: 6 replies, 0 failures", done.stdout), done.stdout


def test_a_run_whose_nodes_lack_their_partition_fails_saying_why(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for _ in range(3):
            federation.start_node("")
        done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", ROUNDS)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(
        r"finished:failed.*the last round \(2/2\) had no successful training reply: "
        r"3 failures \(code 2 ×3\)",
        done.stderr,
    ), done.stderr


def _progress(federation: Deployment, run_id: str) -> tuple[dict[str, Any], int]:
    """The run as ``fedcore ls`` shows it, and the last round its log names (0 before the
    first)."""
    listed = federation.fedcore("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (run,) = [run for run in json.loads(listed.stdout) if run["run_id"] == run_id]
    logged = federation.fedcore("log", run_id)
    assert logged.returncode == 0, logged.stderr
    return run, max((int(k) for k in re.findall(r"round (\d+)/", logged.stdout)), default=0)


def _wait_past_round(federation: Deployment, run_id: str, after: int) -> None:
    """Wait until the run's log names a round past ``after``, or the run completed; fail
    at once if it finished otherwise."""

    def past() -> bool:
        run, reached = _progress(federation, run_id)
        if run["status"] == "finished:completed" or reached > after:
            return True
        assert not run["status"].startswith("finished:"), run
        return False

    wait_until(past, 60, f"a round past {after}", interval=0.2)


def test_the_readmes_link_interrupted_then_killed_mid_run_and_restarted_completes_it(
    tmp_path: Path,
) -> None:
    """The README's lines, the link Ctrl-C'd (SIGINT) and restarted mid-run, then SIGKILLed
    and restarted, each time with its own flags: the run completes, its record whole."""
    rounds = 60
    config = {"num-server-rounds": rounds, "fraction-train": 1.0, "fraction-evaluate": 1.0}
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for node_config in readme_nodes():
            federation.start_node(node_config)
        run_id = federation.submit(QUICKSTART, **config)
        _wait_past_round(federation, run_id, 0)
        # Interrupted first, while the link's own exec holds the ServerApp process; then,
        # as soon as it is back, killed, the ServerApp held by no one.
        for stop in (federation.interrupt, federation.kill):
            run, reached = _progress(federation, run_id)
            assert run["status"] == "running", run  # stopped mid-run, not after its end
            assert reached < rounds
            assert federation.link is not None
            stop(federation.link)
            federation.restart_link()
        # A round logged after the restarts, by a ServerApp that reached the new link.
        _wait_past_round(federation, run_id, _progress(federation, run_id)[1])
        final, _ = federation.follow(run_id)
        assert final["status"] == "finished:completed", final
        pulled = federation.fedcore("pull", run_id, str(tmp_path / "record"))
    assert pulled.returncode == 0, pulled.stderr
    record = tmp_path / "record"
    assert json.loads((record / "run.json").read_text())["status"] == "completed"
    lines = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines if "round" in line] == list(range(1, rounds + 1))
    assert (record / "model.npz").exists()
