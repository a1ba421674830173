"""A stranger who spends the nodes' request rate does not stop them (issue #24, item 4).

The link's fleet rate limit is kept per IP address, so whoever shares the nodes'
address (behind one NAT; here, loopback) can spend it with unsigned garbage. The
nodes' calls then end RESOURCE_EXHAUSTED: they must back off and retry, never exit,
and a run submitted once the flood stops completes.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from fedcore.testing.deployment import Deployment, Server
from fedcore.testing.stranger import raw_fleet_call
from fedcore.wire.rpc import FleetMethod

SLOW_APP = Path(__file__).resolve().parent / "slow_app"
RATE = 10  # calls per second the link lets one address start (bursts of twice that)
FLOODERS = 4
MAX_CALLS = 20_000
FLOOD_DEADLINE = 30.0
AFTER_REFUSED = 3.0
"""Seconds the flood goes on once both nodes were refused: time enough to exit, on main."""

pytestmark = pytest.mark.timeout(180)


def _refused(node: Server) -> bool:
    return "RESOURCE_EXHAUSTED" in node.output.read_text(errors="replace")


def _flood(port: int, nodes: list[Server]) -> int:
    """Unsigned garbage from loopback until both nodes were refused for a while; the count.

    Bounded: at most MAX_CALLS calls and FLOOD_DEADLINE seconds.
    """

    async def flood() -> int:
        calls = 0
        stop_at = time.monotonic() + FLOOD_DEADLINE

        async def flooder() -> None:
            nonlocal calls, stop_at
            while calls < MAX_CALLS and time.monotonic() < stop_at:
                calls += 1
                await raw_fleet_call(port, FleetMethod.PULL_MESSAGES, b"garbage", signed=False)
                if all(_refused(node) for node in nodes):
                    stop_at = min(stop_at, time.monotonic() + AFTER_REFUSED)

        async with anyio.create_task_group() as tg:
            for _ in range(FLOODERS):
                tg.start_soon(flooder)
        return calls

    return anyio.run(flood)


def test_nodes_refused_for_a_flood_on_their_address_stay_up_and_the_run_completes(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0, heartbeat_patience=5.0) as deployment:
        link = deployment.start_link("--fleet-requests-per-second", str(RATE), database=":memory:")
        nodes = [deployment.start_node(f"partition-id={index}") for index in range(2)]
        calls = _flood(link.listeners["fleet"].port, nodes)
        for node in nodes:
            assert _refused(node), f"the flood of {calls} calls never reached {node.name}"
            assert node.process.poll() is None, f"{node.name} exited:\n{node.tail()}"
        run_id = deployment.submit(
            SLOW_APP,
            rounds=2,
            **{"min-nodes": 2, "import-seconds": 0.0, "block-seconds": 0.0, "train-seconds": 0.1},
        )
        final, replies = deployment.follow_printed(run_id)
        assert final["status"] == "finished:completed", final
        assert [reply["code"] for reply in replies] == [None] * 4, replies
        for node in nodes:
            assert node.process.poll() is None, f"{node.name} exited:\n{node.tail()}"
            warnings = node.output.read_text(errors="replace").count("retrying with backoff")
            assert warnings >= 1, node.tail()
