"""The ServerApp and every node's ClientApp process report the environment they started with.

What a process started with is ``/proc/self/environ``, not ``os.environ``: a variable
removed from ``os.environ`` after the start still shows there, to every process of
the same user. Each report is one JSON line the ServerApp prints: ``{"process":
"server" | "client", "names": [the variables' names, sorted]}``.
"""

from __future__ import annotations

import json
from pathlib import Path

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()


def _names() -> list[str]:
    entries = Path("/proc/self/environ").read_bytes().split(b"\0")
    return sorted(entry.split(b"=", 1)[0].decode() for entry in entries if entry)


@client.query()
def report(msg: fc.Message, context: fc.Context) -> fc.Message:
    content = fc.RecordDict({"environ": fc.ConfigRecord({"names": " ".join(_names())})})
    return fc.Message(content, reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    print(json.dumps({"process": "server", "names": _names()}), flush=True)
    await grid.wait_for_nodes(context.run_config["min-nodes"], timeout=60)
    node_ids = await grid.get_node_ids()
    messages = [fc.Message(fc.RecordDict(), node_id, "query") for node_id in node_ids]
    for reply in await grid.send_and_receive(messages, timeout=60):
        if reply.has_error():
            print(json.dumps({"error": reply.error.code, "reason": reply.error.reason}), flush=True)
        else:
            names = str(reply.content["environ"]["names"]).split()
            print(json.dumps({"process": "client", "names": names}), flush=True)
