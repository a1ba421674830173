"""A call cut off by the link's death leaves the caller's task as it found it.

grpclib ends the calls of a lost connection by cancelling the tasks inside them,
natively (``Task.cancel``), and then raises StreamTerminatedError in place of the
CancelledError. On Python 3.11 that leaves the task's cancellation count raised:
the task then looks as if someone had asked to cancel it, and the next cancel
scope it leaves (anyio's, or asyncio.timeout) lets a CancelledError escape that
should have stopped there. A node's main task died that way after a link restart.
"""

from __future__ import annotations

import asyncio
import sys

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from fedcore.errors import LinkUnavailableError
from fedcore.transport.grpc.client import GrpcFleetClient

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LINK = """
import sys, anyio
from fedcore.clock import SystemClock
from fedcore.testing.fleet import FakeFleet
from fedcore.auth.fleet_gate import NodeGate
from fedcore.transport.grpc.server import serve_fleet

class Announcing(FakeFleet):
    async def pull_messages(self, *args, **kwargs):
        print("pulling", flush=True)  # the test kills this process now
        return await super().pull_messages(*args, **kwargs)

async def main():
    fleet = Announcing()
    async with serve_fleet(fleet, "127.0.0.1", 0, gate=NodeGate(fleet, SystemClock())) as listener:
        print(listener.port, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_a_pull_cut_off_by_the_links_death_leaves_no_cancellation_behind() -> None:
    async with await anyio.open_process([sys.executable, "-c", LINK]) as link:
        assert link.stdout is not None
        lines = BufferedByteReceiveStream(link.stdout)
        port = int(await lines.receive_until(b"\n", 100))
        async with GrpcFleetClient("127.0.0.1", port) as fleet:
            node_id = await fleet.register_node({}, 1.0)
            task = asyncio.current_task()
            assert task is not None
            async with anyio.create_task_group() as tasks:

                async def kill_when_pulling() -> None:
                    assert await lines.receive_until(b"\n", 100) == b"pulling"
                    link.kill()

                tasks.start_soon(kill_when_pulling)
                with pytest.raises(LinkUnavailableError):
                    await fleet.pull_messages(node_id, wait_seconds=30.0)
            assert task.cancelling() == 0
            # And a cancel scope this task leaves later still stops its own cancellation.
            with anyio.move_on_after(0.01):
                await anyio.sleep_forever()
