"""The ClientApp of the backend conformance suite (:mod:`fedcore.testing.backend`).

Its workers import it by name, so it lives in a module of its own, which imports
nothing of pytest's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import anyio

from fedcore.apps.client_app import ClientApp
from fedcore.domain import Context, Message, MetricRecord, RecordDict

SETUPS: list[int] = []
"""The pid of each lifespan setup this process ran."""
CRASH_STATUS = 3
"""The exit status of a worker that ``query.crash`` ends."""

client = ClientApp()


@client.lifespan()
def lifespan() -> Iterator[None]:
    SETUPS.append(os.getpid())
    yield


def _reply(msg: Message, **metrics: int | float) -> Message:
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@client.query("whoami")
def whoami(msg: Message, context: Context) -> Message:
    """This process's pid, how many lifespans it set up, and its one visible GPU (or -1)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return _reply(
        msg, pid=os.getpid(), setups=len(SETUPS), device=int(devices) if devices.isdigit() else -1
    )


@client.query("crash")
def crash(msg: Message, context: Context) -> Message:
    """Partition 0 ends its process with :data:`CRASH_STATUS`; the others answer."""
    if context.node_config["partition-id"] == 0:
        os._exit(CRASH_STATUS)
    return _reply(msg, pid=os.getpid())


@client.query("hang")
async def hang(msg: Message, context: Context) -> Message:
    """Partition 0 never answers; the others do at once."""
    if context.node_config["partition-id"] == 0:
        await anyio.sleep(3600)
    return _reply(msg, pid=os.getpid())


@client.query("slow")
def slow(msg: Message, context: Context) -> Message:
    """Answer after the config's ``seconds``."""
    time.sleep(float(msg.content["config"]["seconds"]))  # type: ignore[arg-type]
    return _reply(msg, pid=os.getpid())
