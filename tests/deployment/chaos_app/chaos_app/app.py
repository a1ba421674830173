"""Rounds to every online node; each reply (or error) is logged as one JSON line.

The ServerApp logs ``{"round", "partition", "code", "at"}`` per reply, ``at`` being
the wall time the reply reached it, and writes ``marker-dir/round-N`` as each round
starts. The ClientApp can be told to hold (sleep) or crash in a given round.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()


def _mark(context: fc.Context, name: str) -> None:
    folder = context.run_config["marker-dir"]
    if folder:
        Path(folder, name).write_text(str(time.time()))


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    config, partition = context.run_config, context.node_config["partition-id"]
    server_round = msg.content["config"]["round"]
    if partition == config["crash-partition"] and server_round == config["crash-round"]:
        os._exit(1)
    if partition == config["hold-partition"] and server_round == config["hold-round"]:
        _mark(context, "held")
        time.sleep(config["hold-seconds"])
    time.sleep(config["delay"])
    metrics = fc.MetricRecord({"partition": partition})
    return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    await grid.wait_for_nodes(config["min-nodes"], timeout=60)
    for server_round in range(1, config["rounds"] + 1):
        _mark(context, f"round-{server_round}")
        node_ids = await grid.get_node_ids()
        content = fc.RecordDict({"config": fc.ConfigRecord({"round": server_round})})
        messages = [fc.Message(content, node_id, "train") for node_id in node_ids]
        async for reply in grid.receive(await grid.push_messages(messages), timeout=60):
            if reply.has_error():
                code, partition = reply.error.code, None
            else:
                code, partition = None, reply.content["metrics"]["partition"]
            line = {"round": server_round, "partition": partition, "code": code, "at": time.time()}
            print(json.dumps(line), flush=True)
