"""RELIABILITY.md on a real deployment: kills and crashes of each process, and a link restart.

Short intervals as RELIABILITY.md asks: heartbeat 1 s, patience 2. The chaos app
(``chaos_app/``) logs every reply it gets as a JSON line with its error code and
arrival time, and leaves marker files the tests wait for.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.deployment import FEDCORE, Deployment, Server, run_config_text
from fedcore.testing.waiting import wait_until

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
RESUME_APP = Path(__file__).resolve().parents[1] / "results" / "resume_app"
HEARTBEAT = 1.0
PATIENCE = 2.0

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Deployment]:
    with Deployment(tmp_path, heartbeat_interval=HEARTBEAT) as deployment:
        deployment.start_link()
        for index in range(3):
            deployment.start_node(f"partition-id={index} num-partitions=3")
        (tmp_path / "markers").mkdir()
        yield deployment


def _chaos_config(federation: Deployment, **config: Any) -> dict[str, Any]:
    return {"marker-dir": str(federation.root / "markers"), **config}


def _submit(federation: Deployment, **config: Any) -> str:
    return federation.submit(CHAOS_APP, **_chaos_config(federation, **config))


def _by_round(replies: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    rounds: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for reply in replies:
        rounds[reply["round"]].append(reply)
    return rounds


def test_a_node_killed_mid_round_is_answered_with_code_5_in_time_and_the_run_goes_on(
    federation: Deployment,
) -> None:
    hold = {"hold-partition": 0, "hold-round": 2, "hold-seconds": 60}
    run_id = _submit(federation, rounds=3, **hold)
    federation.wait_for_file(federation.root / "markers" / "held")
    node0 = next(server for server in federation.servers if server.name == "node0")
    killed_at = time.time()
    federation.kill(node0)
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    rounds = _by_round(replies)
    (lost,) = [reply for reply in rounds[2] if reply["code"] is not None]
    assert lost["code"] == 5
    assert lost["at"] - killed_at <= PATIENCE * HEARTBEAT + 1.0
    assert sorted(r["partition"] for r in rounds[2] if r["code"] is None) == [1, 2]
    assert sorted(r["partition"] for r in rounds[3]) == [1, 2]


def test_a_crashed_clientapp_process_is_code_8_and_the_next_round_is_fine(
    federation: Deployment,
) -> None:
    run_id = _submit(federation, rounds=3, **{"crash-partition": 1, "crash-round": 2})
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    rounds = _by_round(replies)
    assert sorted((r["partition"], r["code"]) for r in rounds[2] if r["code"] is not None) == [
        (None, 8)
    ]
    assert sorted(r["partition"] for r in rounds[3] if r["code"] is None) == [0, 1, 2]


@pytest.fixture
def no_restarts(tmp_path: Path) -> Iterator[Deployment]:
    with Deployment(tmp_path, heartbeat_interval=HEARTBEAT) as deployment:
        deployment.start_link("--max-restarts", "0")
        for index in range(3):
            deployment.start_node(f"partition-id={index} num-partitions=3")
        (tmp_path / "markers").mkdir()
        yield deployment


def test_without_restarts_a_killed_serverapp_fails_its_run_at_once(no_restarts: Deployment) -> None:
    federation = no_restarts
    run_id = _submit(federation, rounds=100_000, delay=0.05)
    federation.wait_for_file(federation.root / "markers" / "round-3")
    (pid,) = federation.app_pids()
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    final, _ = federation.follow_printed(run_id)
    assert final["status"] == "finished:failed", final
    assert final["reason"] == "the ServerApp process was killed by SIGKILL"
    # The exec sees its child exit: seconds (CLI start-up included), not a heartbeat timeout.
    assert time.monotonic() - killed_at < 5.0
    assert federation.app_pids() == []


def test_a_serverapp_killed_in_round_5_of_10_is_started_again_and_goes_on_from_round_5(
    federation: Deployment, tmp_path: Path
) -> None:
    """The default (``--max-restarts 1``): the new process goes on from the checkpoint of
    round 4 on the link, does round 5 again, and the record has every round once."""
    paused = tmp_path / "markers" / "paused"
    run_id = federation.submit(
        RESUME_APP, **{"num-server-rounds": 10, "min-nodes": 3, "pause-round": 5,
                       "pause-file": str(paused)},
    )  # fmt: skip
    federation.wait_for_file(paused)
    (first,) = federation.app_pids()
    os.kill(first, signal.SIGKILL)
    final, lines = federation.follow(run_id)
    assert final["status"] == "finished:completed", final
    assert any("starting the ServerApp again (restart 1 of 1)" in line for line in lines), lines
    assert any("resuming after round 4 of 10" in line for line in lines), lines
    assert sum("round 5/10" in line for line in lines) == 1  # the killed one never reported

    pulled = federation.fedcore("pull", run_id, str(tmp_path / "pulled"))
    assert pulled.returncode == 0, pulled.stderr
    rows = [
        json.loads(line)
        for line in (tmp_path / "pulled" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["round"] for row in rows if "round" in row] == list(range(1, 11))
    assert sum("run" in row for row in rows) == 1  # one header: the new process sent none
    assert (tmp_path / "pulled" / "model.npz").exists()
    assert federation.app_pids() == []


def test_with_max_restarts_a_killed_serverapp_is_started_again_then_fails_at_once(
    tmp_path: Path,
) -> None:
    federation = Deployment(tmp_path, heartbeat_interval=HEARTBEAT)
    with federation:
        federation.start_link("--max-restarts", "1")
        for index in range(3):
            federation.start_node(f"partition-id={index} num-partitions=3")
        (tmp_path / "markers").mkdir()
        run_id = _submit(federation, rounds=100_000, delay=0.05)
        federation.wait_for_file(federation.root / "markers" / "round-3")
        (first,) = federation.app_pids()
        os.kill(first, signal.SIGKILL)
        # The link's exec starts it again ...
        federation.wait_for_file(federation.link_work_dir / "runs" / f"{run_id}-1-restart1.pid")
        (second,) = wait_until(
            lambda: [pid for pid in federation.app_pids() if pid != first],
            30,
            "a second ServerApp process",
        )
        # ... and the second kill, with no restart left, ends the run.
        killed_at = time.monotonic()
        os.kill(second, signal.SIGKILL)
        final, _ = federation.follow_printed(run_id)
        assert final["status"] == "finished:failed", final
        assert final["reason"] == "the ServerApp process was killed by SIGKILL (after 1 restart)"
        # The exec sees its child exit: seconds (CLI start-up included), not a heartbeat timeout.
        assert time.monotonic() - killed_at < 5.0
        assert federation.app_pids() == []


def test_a_stopped_run_ends_its_serverapp_and_its_stream_with_status_3(
    federation: Deployment,
) -> None:
    assert federation.link is not None
    config = run_config_text(_chaos_config(federation, rounds=100_000, delay=0.05))
    streaming = subprocess.Popen(
        [str(FEDCORE), "run", str(CHAOS_APP), "--stream", "--json", "--run-config", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=federation.cli_environment(),
        cwd=federation.root,
    )
    try:
        federation.wait_for_file(federation.root / "markers" / "round-2")
        (listed,) = json.loads(federation.fedcore("ls", "--json").stdout)
        stopped = federation.fedcore("stop", listed["run_id"], "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["status"] == "finished:stopped"
        out, err = streaming.communicate(timeout=60)
    finally:
        if streaming.poll() is None:
            streaming.kill()
            streaming.communicate()
    assert streaming.returncode == 3, err
    assert json.loads(out.splitlines()[-1])["status"] == "finished:stopped"
    wait_until(lambda: not federation.app_pids(), 30, "the ServerApp to end with its stopped run")


@pytest.mark.slow  # three stops in a row; one stop stays in CI (the test above)
def test_three_stops_in_a_row_each_end_their_run_stopped_and_say_so_last(
    federation: Deployment,
) -> None:
    """One way to end: ``finished:stopped``, and the log's last line says it was stopped.

    A stop drops the run's messages while its ServerApp waits for their replies: it
    is answered code 3 for them, whichever of its calls notices the stop first.
    """
    for attempt in range(3):
        markers = federation.root / f"markers-{attempt}"
        markers.mkdir()
        run_id = _submit(federation, rounds=100_000, delay=0.05, **{"marker-dir": str(markers)})
        federation.wait_for_file(markers / "round-2")
        stopped = federation.fedcore("stop", run_id, "--json")
        assert stopped.returncode == 0, stopped.stderr
        # Its last words are in once its process is gone.
        wait_until(
            lambda: not federation.app_pids(), 30, "the ServerApp to end with its stopped run"
        )
        (run,) = [
            r
            for r in json.loads(federation.fedcore("ls", "--json").stdout)
            if r["run_id"] == run_id
        ]
        assert (run["status"], run["reason"]) == ("finished:stopped", "stopped by the operator")
        shown = federation.fedcore("log", run_id)
        assert shown.returncode == 0, shown.stderr
        last = shown.stdout.splitlines()[-1]
        ending = f"stop {attempt + 1}: the log ends\n{shown.stdout[-3000:]}"
        assert f"run {run_id}" in last, ending
        assert "stopped" in last, ending


def _clientapp_pids(node: Server) -> list[int]:
    """The node's ClientApp processes: its children running a ``python -c`` worker."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == node.process.pid and argv[1:2] == [b"-c"]:
            pids.append(int(stat.parent.name))
    return pids


def test_a_finished_runs_clientapp_processes_end_within_a_few_heartbeats(
    federation: Deployment,
) -> None:
    nodes = [server for server in federation.servers if server.name.startswith("node")]
    run_id = _submit(federation, rounds=3, delay=0.05)
    federation.wait_for_file(federation.root / "markers" / "round-2")
    assert [len(_clientapp_pids(node)) for node in nodes] == [1, 1, 1]
    final, _ = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    # A node asks about its runs every heartbeat (1 s here), not after the 600 s idle timeout.
    wait_until(
        lambda: not any(_clientapp_pids(node) for node in nodes),
        10 * HEARTBEAT,
        lambda: f"the ClientApp processes to end: {[_clientapp_pids(node) for node in nodes]}",
    )


def test_the_link_killed_and_restarted_on_its_database_loses_no_reply(
    federation: Deployment,
) -> None:
    run_id = _submit(federation, rounds=20, delay=0.1)
    federation.wait_for_file(federation.root / "markers" / "round-5")
    assert federation.link is not None
    federation.kill(federation.link)
    federation.restart_link()
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    rounds = _by_round(replies)
    assert sorted(rounds) == list(range(1, 21))
    for number, got in rounds.items():
        assert sorted((r["partition"], r["code"]) for r in got) == [
            (0, None),
            (1, None),
            (2, None),
        ], f"round {number}: {got}"


def test_a_stall_shorter_than_the_patience_does_not_take_a_node_offline(
    federation: Deployment,
) -> None:
    hold = {"hold-partition": 1, "hold-round": 2, "hold-seconds": 0.1}
    run_id = _submit(federation, rounds=3, **hold)
    federation.wait_for_file(federation.root / "markers" / "held")
    node1 = next(server for server in federation.servers if server.name == "node1")
    os.kill(node1.process.pid, signal.SIGSTOP)  # no heartbeats, no replies, for a while
    try:
        # Up to one interval may have passed since its last heartbeat: what is left of
        # the patience is (patience - 1) x interval, and the stall takes most of it.
        time.sleep((PATIENCE - 1) * HEARTBEAT * 0.8)
    finally:
        os.kill(node1.process.pid, signal.SIGCONT)
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    assert all(reply["code"] is None for reply in replies), replies
    assert len(replies) == 9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_link_killed_at_random_moments_loses_no_reply(federation: Deployment) -> None:
    """A soak: the link is SIGKILLed and restarted at random moments of one long run."""
    seed = random.randrange(2**32)
    print(f"chaos seed {seed}")
    chance = random.Random(seed)
    run_id = _submit(federation, rounds=60, delay=0.05)
    federation.wait_for_file(federation.root / "markers" / "round-2")
    for _ in range(5):
        time.sleep(chance.uniform(0.2, 2.0))
        assert federation.link is not None
        federation.kill(federation.link)
        federation.restart_link()
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", (seed, final)
    rounds = _by_round(replies)
    assert sorted(rounds) == list(range(1, 61)), seed
    for number, got in rounds.items():
        assert sorted(((r["partition"], r["code"]) for r in got), key=str) == [
            (0, None),
            (1, None),
            (2, None),
        ], (seed, number, got)
    integrity = sqlite3.connect(federation.root / "link.db").execute("PRAGMA integrity_check")
    assert integrity.fetchone() == ("ok",)
