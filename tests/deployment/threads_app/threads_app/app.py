"""One query to every node; the ServerApp logs each node's report as one JSON line.

A report is the node's ``partition-id`` and the thread variables its ClientApp
process sees (0 where one is not set); an error reply logs its code and reason.
"""

from __future__ import annotations

import json
import os

import fedcore as fc

VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

server = fc.ServerApp()
client = fc.ClientApp()


@client.query()
def report(msg: fc.Message, context: fc.Context) -> fc.Message:
    metrics = {name: int(os.environ.get(name, "0")) for name in VARIABLES}
    metrics["partition"] = context.node_config["partition-id"]
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    await grid.wait_for_nodes(context.run_config["min-nodes"], timeout=60)
    node_ids = await grid.get_node_ids()
    messages = [fc.Message(fc.RecordDict(), node_id, "query") for node_id in node_ids]
    for reply in await grid.send_and_receive(messages, timeout=60):
        if reply.has_error():
            print(json.dumps({"error": reply.error.code, "reason": reply.error.reason}), flush=True)
        else:
            print(json.dumps(dict(reply.content["metrics"])), flush=True)
