"""Nodes whose ClientApp processes an exec of their own starts (``--exec-socket``).

The exec is a process apart (``fedcore serve --role exec --exec-socket``): the
ClientApp processes are its children, not the node's, and they still talk to the
node directly. A crash of one is error code 8 and the next round is whole, as with
processes the node starts itself. Heartbeat 1 s, patience 2, as RELIABILITY.md asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.deployment import Deployment, Server, printed_objects
from fedcore.testing.waiting import wait_until

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"
WORKER = b"fedcore.workers.worker"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Deployment]:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        socket_path = tmp_path / "node-exec.sock"
        deployment.start_node_exec(socket_path)
        for index in range(3):
            deployment.start_node(
                f"partition-id={index} num-partitions=3",
                "--exec-socket", str(socket_path),
                "--exec-secret-file", str(deployment.exec_secret_file),
            )  # fmt: skip
        (tmp_path / "markers").mkdir()
        yield deployment


def _submit(federation: Deployment, **config: object) -> str:
    """Submit a run of the chaos app; its id."""
    markers = str(federation.root / "markers")
    return federation.submit(CHAOS_APP, **{"marker-dir": markers, **config})


def _run(federation: Deployment, **config: object) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the chaos app to its end; its final state and the replies its ServerApp logged."""
    return federation.follow_printed(_submit(federation, **config))


def _replies(federation: Deployment, run_id: str) -> list[dict]:
    """The replies the run's ServerApp has logged so far."""
    logged = federation.fedcore("log", run_id, "--json")
    assert logged.returncode == 0, logged.stderr
    return printed_objects(json.loads(line)["text"] for line in logged.stdout.splitlines())


def _workers(server: Server) -> list[int]:
    """The pids of the ClientApp worker processes among ``server``'s children."""
    children = []
    for task in Path(f"/proc/{server.process.pid}/task").glob("*/children"):
        children += [int(pid) for pid in task.read_text().split()]
    found = []
    for pid in children:
        try:
            if WORKER in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_the_exec_starts_the_clientapps_and_the_run_completes(federation: Deployment) -> None:
    # Looked at while the run is under way (partition 0 holds round 2): a node ends its
    # ClientApp process as soon as the run finishes.
    run_id = _submit(
        federation, rounds=2, **{"hold-partition": 0, "hold-round": 2, "hold-seconds": 3}
    )
    federation.wait_for_file(federation.root / "markers" / "held")
    (node_exec,) = [server for server in federation.servers if server.name.startswith("exec")]
    nodes = [server for server in federation.servers if server.name.startswith("node")]
    assert len(_workers(node_exec)) == 3, "one ClientApp process per node, the exec's children"
    assert all(_workers(node) == [] for node in nodes), "no node started one itself"
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    assert sorted((r["round"], r["partition"]) for r in replies if r["code"] is None) == [
        (round_number, partition) for round_number in (1, 2) for partition in range(3)
    ]


def test_a_crashed_clientapp_process_of_the_exec_is_code_8_and_the_next_round_is_fine(
    federation: Deployment,
) -> None:
    final, replies = _run(federation, rounds=3, **{"crash-partition": 1, "crash-round": 2})
    assert final["status"] == "finished:completed", final
    errors = [(r["round"], r["code"]) for r in replies if r["code"] is not None]
    assert errors == [(2, 8)]
    assert sorted(r["partition"] for r in replies if r["round"] == 3 and r["code"] is None) == [
        0,
        1,
        2,
    ]


def test_the_exec_killed_mid_round_is_code_8_and_a_restarted_exec_serves_the_next(
    federation: Deployment,
) -> None:
    """Its ClientApp processes die with it; the nodes ask again, and the new exec answers."""
    hold = {"hold-partition": 0, "hold-round": 2, "hold-seconds": 60}
    run_id = _submit(federation, rounds=3, **hold)
    federation.wait_for_file(federation.root / "markers" / "held")
    wait_until(
        lambda: len([r for r in _replies(federation, run_id) if r["round"] == 2]) >= 2,
        30,
        "the other nodes' replies to round 2",
    )
    (node_exec,) = [server for server in federation.servers if server.name.startswith("exec")]
    federation.kill(node_exec)
    federation.start_node_exec(federation.root / "node-exec.sock")
    final, replies = federation.follow_printed(run_id)
    assert final["status"] == "finished:completed", final
    assert [(r["round"], r["code"]) for r in replies if r["code"] is not None] == [(2, 8)]
    assert sorted(r["partition"] for r in replies if r["round"] == 3 and r["code"] is None) == [
        0,
        1,
        2,
    ]
