"""Flower's API names at work in a simulation, on every backend: Array items that survive
workers, shared memory and Ray's object store bit for bit, MessageType,
Grid.create_message, delivered_at, and lifespans that take a Context."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from flower_api_apps import client

import fedcore as fc
from fedcore.testing.backends import backend_params

pytestmark = pytest.mark.anyio

# Bit patterns a float cannot always reproduce by arithmetic (NaN payloads, -0.0,
# subnormals), and enough of them (256 KiB, over the process backend's 64 KiB inline
# limit and the ray backend's 64 KiB store threshold) that contents and replies go
# through shared memory, or Ray's object store.
W = np.tile(np.array([0.0, -0.0, np.nan, np.inf, 5e-324, 1.5, -7.25, 1e300], dtype=">f8"), 4096)
W.view(">u8")[2::8] = 0x7FF8_0000_DEAD_BEEF


def _server(seen: list[str]) -> fc.ServerApp:
    server = fc.ServerApp()

    @server.lifespan()
    def lifespan(context: fc.Context) -> Iterator[None]:
        seen.append(f"setup {context.run_id}")
        yield
        seen.append("teardown")

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        assert seen == [f"setup {context.run_id}"]
        nodes = await grid.get_node_ids()
        content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": W})})
        messages = [
            grid.create_message(content, fc.MessageType.TRAIN, node, "round-1") for node in nodes
        ]
        return await grid.send_and_receive(messages)

    return server


@pytest.mark.parametrize("backend", backend_params())
async def test_a_flower_style_client_app_runs_on_every_backend(backend: str) -> None:
    seen: list[str] = []
    app = fc.App(server=_server(seen), client=client)
    extra: dict[str, Any] = {"max_workers": 1} if backend != "inline" else {}
    result = await fc.simulate(app, nodes=3, backend=backend, seed=0, progress=False, **extra)
    replies: list[fc.Message] = result.value
    assert seen[-1] == "teardown"
    assert len(replies) == 3
    for reply in replies:
        assert reply.has_content(), reply
        arrays = reply.content["arrays"]
        for key, want in (("w", W * 2), ("same", W)):
            got = arrays[key]
            assert isinstance(got, fc.Array)
            assert got.dtype.str == want.dtype.str
            assert got.shape == want.shape
            assert got.tobytes() == want.tobytes(), key
        config = reply.content["config"]
        # The lifespan ran around this very message, with its context.
        assert config["lifespan-node"] == config["node"] == reply.metadata.src_node_id
        handed = datetime.fromisoformat(str(config["delivered-at"]))
        answered = datetime.fromisoformat(reply.metadata.delivered_at)
        assert handed.utcoffset() is not None
        assert answered.utcoffset() is not None
        assert reply.metadata.created_at - 1 <= handed.timestamp() <= answered.timestamp()
