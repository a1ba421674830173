"""A Flower-style loop that pulls its round's ids again once every reply is in.

Each round it prints one JSON line: the round, and the error code and message type
of each answer to pulling the received ids a second time. Simulation and deployment
must print the same lines.
"""

from __future__ import annotations

import json

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()


@client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord({"ok": 1})}), reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    node_ids = sorted(await grid.wait_for_nodes(config["min-nodes"], timeout=60))
    for server_round in range(1, config["rounds"] + 1):
        content = fc.RecordDict({"config": fc.ConfigRecord({"round": server_round})})
        ids = await grid.push_messages([fc.Message(content, n, "train") for n in node_ids])
        received = [reply async for reply in grid.receive(ids, timeout=60)]
        assert not any(reply.has_error() for reply in received), received
        again = await grid.pull_messages(ids)
        answers = [[reply.error.code, reply.metadata.message_type] for reply in again]
        print(json.dumps({"round": server_round, "again": answers}), flush=True)
