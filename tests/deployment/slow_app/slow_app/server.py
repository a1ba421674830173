"""A ServerApp whose own code starves its event loop: at import, then inside ``main``.

Importing this module takes ``import-seconds`` of the app directory's defaults (read
from its ``pyproject.toml``, since no run config exists before the app is loaded);
``main`` then blocks its loop for ``block-seconds`` and runs ``rounds`` rounds to
every node, logging each reply as one JSON line.
"""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path

import fedcore as fc

_DEFAULTS = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
time.sleep(_DEFAULTS["tool"]["fedcore"]["app"]["config"]["import-seconds"])

server = fc.ServerApp()


@server.main()
async def main(grid: fc.Grid, context: fc.Context) -> None:
    config = context.run_config
    await grid.wait_for_nodes(config["min-nodes"], timeout=120)
    time.sleep(config["block-seconds"])  # noqa: ASYNC251 - the app's own blocking code
    for server_round in range(1, config["rounds"] + 1):
        node_ids = await grid.get_node_ids()
        content = fc.RecordDict({"config": fc.ConfigRecord({"round": server_round})})
        messages = [fc.Message(content, node_id, "train") for node_id in node_ids]
        async for reply in grid.receive(await grid.push_messages(messages), timeout=120):
            code = reply.error.code if reply.has_error() else None
            print(json.dumps({"round": server_round, "code": code}), flush=True)
