"""Fake nodes cost the link a bounded while, and a flood of them is limited (issue #24, item 3).

A key may declare any heartbeat interval and never heartbeat: 2,000 keys declaring
1e9 s stayed online for ever, and a 2-node run sent them its messages and waited.
Now the link refuses an interval over ``--max-heartbeat-interval``, so a fake that
stops goes offline within patience × that bound; it retires a node offline for
``--retire-nodes-after`` from its database; and registrations from one address are
rate-limited while real nodes elsewhere still register. Small numbers and short
bounds, set by flag: the probe's 2,000 keys are 50 here.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from fedcore.testing.deployment import Deployment, printed_objects
from fedcore.testing.stranger import register_stranger
from fedcore.testing.waiting import wait_until

RECORD_APP = Path(__file__).resolve().parent / "record_app"
FAKES = 50
BOUND = 2.0
"""The link's --max-heartbeat-interval: a fake declaring it is offline 4 s later."""
PATIENCE = 2.0
RETIRE_AFTER = 3.0
DEADLINE = 30.0
"""Seconds a condition that should hold within a few may take on a loaded machine."""
RUN_DEADLINE = 60.0
"""A 2-round run of 2 nodes takes a few seconds; beside online fakes it never ended."""
FLOODER = "127.0.0.2"
"""Another peer on loopback: the flood's address, not the real nodes' 127.0.0.1."""

pytestmark = pytest.mark.timeout(180)


def _registered(
    port: int, interval: float, count: int, source: str | None = None
) -> list[GRPCError | None]:
    """Register ``count`` fake nodes declaring ``interval``, ten at a time; each outcome."""

    async def register() -> list[GRPCError | None]:
        outcomes: list[GRPCError | None] = []

        async def one() -> None:
            outcomes.append(await register_stranger(port, interval, source=source))

        for start in range(0, count, 10):
            async with anyio.create_task_group() as tg:
                for _ in range(min(10, count - start)):
                    tg.start_soon(one)
        return outcomes

    return anyio.run(register)


def _online(deployment: Deployment) -> int:
    listed = deployment.fedcore("ls", "--nodes", "--json")
    assert listed.returncode == 0, listed.stderr
    return sum(node["online"] for node in json.loads(listed.stdout))


def _rows(database: Path) -> int:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        (count,) = db.execute("SELECT count(*) FROM nodes").fetchone()
    return int(count)


def _run_completes(deployment: Deployment, nodes: int) -> float:
    """A 2-round FedAvg run over the online nodes completes, every node adding 1 a round;
    the seconds it took."""
    start = time.monotonic()
    run_id = deployment.submit(RECORD_APP, rounds=2, **{"min-nodes": nodes})
    followed = deployment.fedcore("log", run_id, "--follow", "--json", timeout=RUN_DEADLINE)
    assert followed.returncode == 0, followed.stderr
    *lines, final = [json.loads(line) for line in followed.stdout.splitlines()]
    assert final["status"] == "finished:completed", final
    (printed,) = printed_objects(line["text"] for line in lines)
    np.testing.assert_array_equal(printed["model"]["w"], np.full((2, 3), 2.0))
    return time.monotonic() - start


def test_fakes_go_offline_within_the_bound_are_retired_and_a_run_beside_them_completes(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0, heartbeat_patience=PATIENCE) as deployment:
        link = deployment.start_link(
            "--max-heartbeat-interval", str(BOUND), "--retire-nodes-after", str(RETIRE_AFTER)
        )
        port = link.listeners["fleet"].port
        forever = _registered(port, 1e9, FAKES)
        assert all(isinstance(error, GRPCError) for error in forever), forever
        assert {error.status for error in forever if error is not None} == {Status.INVALID_ARGUMENT}
        assert all("max-heartbeat-interval" in (error.message or "") for error in forever if error)
        at_bound = _registered(port, BOUND, FAKES)
        assert at_bound == [None] * FAKES
        registered = time.monotonic()
        nodes = [deployment.start_node(f"partition-id={index}") for index in range(2)]
        wait_until(
            lambda: _online(deployment) == 2, DEADLINE, "the fakes offline, the real nodes online"
        )
        assert time.monotonic() - registered < PATIENCE * BOUND + DEADLINE
        took = _run_completes(deployment, nodes=2)
        assert took < RUN_DEADLINE
        database = tmp_path / "link.db"
        wait_until(lambda: _rows(database) == 2, DEADLINE, "the fakes retired from the database")
        retired = re.findall(r"retired (\d+) nodes offline", link.output.read_text())
        assert sum(map(int, retired)) == FAKES, retired
        for node in nodes:
            assert node.process.poll() is None, node.tail()


def test_a_registration_flood_from_one_address_is_limited_and_real_nodes_still_register(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path) as deployment:
        link = deployment.start_link(
            "--fleet-registrations-per-second", "1", "--fleet-registration-burst", "5",
            database=":memory:",
        )  # fmt: skip
        port = link.listeners["fleet"].port
        flood = _registered(port, 1.0, FAKES, source=FLOODER)
        admitted = flood.count(None)
        refused = [error for error in flood if error is not None]
        assert 5 <= admitted <= 5 + 10, f"{admitted} of {FAKES} registered"
        assert {error.status for error in refused} == {Status.RESOURCE_EXHAUSTED}
        assert all(f"{FLOODER} is over its registration rate" in (e.message or "") for e in refused)
        nodes = [deployment.start_node(f"partition-id={index}") for index in range(2)]
        # The flood's fakes never beat (offline 2 s after), the real nodes do.
        wait_until(lambda: _online(deployment) == 2, DEADLINE, "the real nodes registered, online")
        for node in nodes:
            assert "registered with the link as node" in node.output.read_text(), node.tail()
            assert "RESOURCE_EXHAUSTED" not in node.output.read_text(), node.tail()
        assert "over its registration rate" in link.output.read_text()
