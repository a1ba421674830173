"""The ServerApp and every node's ClientApp process report the environment they started with.

What a process started with is ``/proc/self/environ``, not ``os.environ``: a variable
removed from ``os.environ`` after the start still shows there, to every process of
the same user — unless the process is not dumpable, as every app process now makes
itself: then only root may read it, the process itself included, so it lets itself
read it for a moment. Each report is one JSON line the ServerApp prints: ``{"process":
"server" | "client", "names": [the variables' names, sorted], "dumpable": 0 | 1}``,
``dumpable`` as the process was when the app started.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()


PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4


def _prctl(option: int, value: int = 0) -> int:
    result: int = ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
    return result


def _names() -> list[str]:
    dumpable = _prctl(PR_GET_DUMPABLE)
    _prctl(PR_SET_DUMPABLE, 1)
    try:
        entries = Path("/proc/self/environ").read_bytes().split(b"\0")
    finally:
        _prctl(PR_SET_DUMPABLE, dumpable)
    return sorted(entry.split(b"=", 1)[0].decode() for entry in entries if entry)


@client.query()
def report(msg: fc.Message, context: fc.Context) -> fc.Message:
    names = " ".join(_names())
    content = fc.RecordDict(
        {"environ": fc.ConfigRecord({"names": names, "dumpable": _prctl(PR_GET_DUMPABLE)})}
    )
    return fc.Message(content, reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    report = {"process": "server", "names": _names(), "dumpable": _prctl(PR_GET_DUMPABLE)}
    print(json.dumps(report), flush=True)
    await grid.wait_for_nodes(context.run_config["min-nodes"], timeout=60)
    node_ids = await grid.get_node_ids()
    messages = [fc.Message(fc.RecordDict(), node_id, "query") for node_id in node_ids]
    for reply in await grid.send_and_receive(messages, timeout=60):
        if reply.has_error():
            print(json.dumps({"error": reply.error.code, "reason": reply.error.reason}), flush=True)
        else:
            environ = reply.content["environ"]
            names = str(environ["names"]).split()
            report = {"process": "client", "names": names, "dumpable": environ["dumpable"]}
            print(json.dumps(report), flush=True)
