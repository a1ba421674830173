"""ClientApps for the process-pool and Ray tests; workers and actors import them by name."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio

import fedcore as fc

SETUPS: list[int] = []

client = fc.ClientApp()


@client.lifespan()
def lifespan():  # type: ignore[no-untyped-def]
    SETUPS.append(os.getpid())
    yield


def _reply(msg: fc.Message, **metrics: int | float) -> fc.Message:
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


@client.query("whoami")
def whoami(msg: fc.Message, context: fc.Context) -> fc.Message:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return _reply(
        msg,
        pid=os.getpid(),
        setups=len(SETUPS),
        device=int(devices) if devices.isdigit() else -1,
    )


@client.query("crash")
def crash(msg: fc.Message, context: fc.Context) -> fc.Message:
    if context.node_config["partition-id"] == 0:
        os._exit(3)
    return _reply(msg, pid=os.getpid())


@client.query("hang")
async def hang(msg: fc.Message, context: fc.Context) -> fc.Message:
    if context.node_config["partition-id"] == 0:
        await anyio.sleep(3600)
    return _reply(msg, pid=os.getpid())


@client.query("slow")
def slow(msg: fc.Message, context: fc.Context) -> fc.Message:
    time.sleep(float(msg.content["config"]["seconds"]))  # type: ignore[arg-type]
    return _reply(msg, pid=os.getpid())


@client.query("asked")
def asked(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Quick, unless the message's config asks otherwise: ``fail`` raises, ``exit`` ends the
    process, ``kill-once`` (a path) SIGKILLs it, as if from outside, unless that file exists."""
    config = msg.content["config"]
    if config.get("fail"):
        raise ValueError("the author's bug")
    if config.get("exit"):
        os._exit(3)
    marker = config.get("kill-once")
    if isinstance(marker, str) and not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return _reply(msg, pid=os.getpid())


@client.train()
def echo(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Return the arrays unchanged (the W1 workload)."""
    content = fc.RecordDict(
        {"arrays": msg.content["arrays"], "metrics": fc.MetricRecord({"num-examples": 1})}
    )
    return fc.Message(content, reply_to=msg)


hanging_server = fc.ServerApp()


@hanging_server.main()
async def hang_everywhere(grid: fc.Grid, context: fc.Context) -> None:
    nodes = await grid.get_node_ids()
    await grid.send_and_receive([fc.Message(fc.RecordDict(), n, "query.hang") for n in nodes])


hanging = fc.App(server=hanging_server, client=client)
"""An app whose every ClientApp call on partition 0 hangs: for interrupting."""


asking_server = fc.ServerApp()


@asking_server.main()
async def ask_everywhere(grid: fc.Grid, context: fc.Context) -> None:
    nodes = await grid.get_node_ids()
    replies = await grid.send_and_receive(
        [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
    )
    print("replies:", sum(reply.has_content() for reply in replies))


asking = fc.App(server=asking_server, client=client)
"""An app that asks every node who it is, once, and prints how many answered."""
