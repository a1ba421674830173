"""A deployment on a busy machine tells slow from dead (issue: liveness without false alarms).

Two CPU-bound processes spin beside the link and its nodes on this 2-core machine. The
app's ServerApp takes 6 s to import and then blocks its own event loop for 6 s, with
the link asking it for a heartbeat every second (patience 2): only its exec vouching
for the process it holds keeps the run alive. Its ClientApps train CPU-bound. Beside
the same load, real deaths are still found as fast as on a quiet machine.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment
from fedcore.testing.load import busy_processes

SLOW_APP = Path(__file__).resolve().parent / "slow_app"
CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
HEARTBEAT = 1.0
PATIENCE = 2.0

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def busy_federation(tmp_path: Path) -> Iterator[Deployment]:
    with (
        busy_processes(2, seconds=300),
        Deployment(
            tmp_path, heartbeat_interval=HEARTBEAT, heartbeat_patience=PATIENCE
        ) as deployment,
    ):
        # No restarts: a killed ServerApp is to fail its run, found in time beside the load.
        deployment.start_link("--heartbeat-interval", repr(HEARTBEAT), "--max-restarts", "0")
        for index in range(3):
            deployment.start_node(f"partition-id={index} num-partitions=3")
        (tmp_path / "markers").mkdir()
        yield deployment


@pytest.mark.slow  # a soak beside CPU-bound processes: 20 s of CI's 20 minutes
def test_a_serverapp_that_blocks_its_loop_completes_beside_busy_processes(
    busy_federation: Deployment,
) -> None:
    run_id = busy_federation.submit(SLOW_APP, rounds=3)
    final, replies = busy_federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    assert [reply["code"] for reply in replies] == [None] * 9, replies


def test_a_node_killed_mid_round_beside_busy_processes_is_found_in_time(
    busy_federation: Deployment,
) -> None:
    markers = busy_federation.root / "markers"
    hold = {"hold-partition": 0, "hold-round": 2, "hold-seconds": 60}
    run_id = busy_federation.submit(CHAOS_APP, rounds=3, **{"marker-dir": str(markers)}, **hold)
    busy_federation.wait_for_file(markers / "held")
    node0 = next(server for server in busy_federation.servers if server.name == "node0")
    killed_at = time.time()
    busy_federation.kill(node0)
    final, replies = busy_federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    (lost,) = [reply for reply in replies if reply["round"] == 2 and reply["code"] is not None]
    assert lost["code"] == 5
    assert lost["at"] - killed_at <= PATIENCE * HEARTBEAT + 1.0


def test_a_serverapp_killed_beside_busy_processes_fails_its_run_at_once(
    busy_federation: Deployment,
) -> None:
    markers = busy_federation.root / "markers"
    run_id = busy_federation.submit(
        CHAOS_APP, rounds=100_000, delay=0.05, **{"marker-dir": str(markers)}
    )
    busy_federation.wait_for_file(markers / "round-3")
    (pid,) = busy_federation.app_pids()
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    final, _ = busy_federation.follow_printed(run_id)
    assert final["status"] == "finished:failed", final
    assert final["reason"] == "the ServerApp process was killed by SIGKILL"
    assert time.monotonic() - killed_at < 10.0
