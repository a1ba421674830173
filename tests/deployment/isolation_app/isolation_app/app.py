"""The ServerApp and every node's ClientApp process try to read what they should not.

Each process reports, as one JSON line the ServerApp prints: who it runs as
(``uid``), whether other processes of its user may read its memory (``dumpable``),
and what came of trying to read the link's database, the nodes' keys (paths from the
run config), the memory and initial environment of its starter (its parent: the
link, or the node) and — for a ClientApp — of the run's ServerApp process. An
outcome is ``"read"`` or the error's name (``"EACCES"``, ...).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()

PR_GET_DUMPABLE = 3


def _dumpable() -> int:
    result: int = ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    return result


def _read(path: str) -> str:
    """``"read"`` if ``path`` opens (for ``/proc/PID/mem``, opening is the access check)
    and its first byte reads, else the error's name."""
    try:
        with open(path, "rb") as file:
            if not path.endswith("/mem"):
                file.read(1)
        return "read"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


def _process(pid: int) -> dict[str, str]:
    return {"mem": _read(f"/proc/{pid}/mem"), "environ": _read(f"/proc/{pid}/environ")}


def _report(process: str, config: fc.ConfigRecord | dict[str, object]) -> dict[str, object]:
    keys = [key for key in str(config["keys"]).split(",") if key]
    return {
        "process": process,
        "uid": os.geteuid(),
        "dumpable": _dumpable(),
        "database": _read(str(config["database"])),
        "keys": {key: _read(key) for key in keys},
        "starter": _process(os.getppid()),
    }


@client.query()
def probe(msg: fc.Message, context: fc.Context) -> fc.Message:
    config = msg.content["probe"]
    report = _report("client", config)
    report["server"] = _process(int(config["server-pid"]))
    content = fc.RecordDict({"report": fc.ConfigRecord({"json": json.dumps(report)})})
    return fc.Message(content, reply_to=msg)


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    print(json.dumps(_report("server", dict(config))), flush=True)
    await grid.wait_for_nodes(config["min-nodes"], timeout=60)
    probe = fc.ConfigRecord(
        {"server-pid": os.getpid(), "database": config["database"], "keys": config["keys"]}
    )
    messages = [
        fc.Message(fc.RecordDict({"probe": probe}), node_id, "query")
        for node_id in await grid.get_node_ids()
    ]
    for reply in await grid.send_and_receive(messages, timeout=60):
        if reply.has_error():
            print(json.dumps({"error": reply.error.code, "reason": reply.error.reason}), flush=True)
        else:
            print(reply.content["report"]["json"], flush=True)
