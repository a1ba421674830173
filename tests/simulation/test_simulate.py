"""The simulation runtime end to end, through the public API."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio.lowlevel
import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import ErrorCode
from fedcore.errors import AppLoadError, UsageError

pytestmark = pytest.mark.anyio


def _reply(msg: fc.Message, **metrics: int | float) -> fc.Message:
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


def _app(client: fc.ClientApp, main: Any) -> fc.App:
    server = fc.ServerApp()
    server.main()(main)
    return fc.App(server=server, client=client)


async def _ask_all(grid: fc.Grid, message_type: str = "query") -> list[fc.Message]:
    nodes = await grid.get_node_ids()
    messages = [fc.Message(fc.RecordDict(), node, message_type) for node in nodes]
    return await grid.send_and_receive(messages)


async def test_value_and_server_context() -> None:
    client = fc.ClientApp()

    async def main(grid: fc.Grid, context: fc.Context) -> str:
        context.state["seen"] = fc.MetricRecord({"nodes": len(await grid.get_node_ids())})
        return "done"

    result = await fc.simulate(_app(client, main), nodes=7, run_config={"x": 1}, seed=3)
    assert result.value == "done"
    assert result.seed == 3
    assert result.context.run_config == {"x": 1}
    assert result.context.state["seen"]["nodes"] == 7


async def test_node_config_and_state_persist_across_rounds() -> None:
    client = fc.ClientApp()

    @client.query()
    def count(msg: fc.Message, context: fc.Context) -> fc.Message:
        calls = context.state.setdefault("calls", fc.MetricRecord({"n": 0}))
        calls["n"] = int(calls["n"]) + 1  # type: ignore[call-overload]
        return _reply(
            msg,
            partition=context.node_config["partition-id"],
            partitions=context.node_config["num-partitions"],
            calls=calls["n"],
        )

    async def main(grid: fc.Grid, context: fc.Context) -> list[list[fc.Message]]:
        return [await _ask_all(grid) for _ in range(3)]

    rounds = (await fc.simulate(_app(client, main), nodes=5, seed=0)).value
    last = [reply.content["metrics"] for reply in rounds[-1]]
    assert sorted(m["partition"] for m in last) == [0, 1, 2, 3, 4]
    assert {m["partitions"] for m in last} == {5}
    assert {m["calls"] for m in last} == {3}


async def test_client_exception_becomes_error_reply() -> None:
    client = fc.ClientApp()

    @client.train()
    async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        if context.node_config["partition-id"] == 1:
            raise ZeroDivisionError("division by zero")
        return _reply(msg, ok=1)

    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        return await _ask_all(grid, "train")

    replies = (await fc.simulate(_app(client, main), nodes=3, seed=0)).value
    errors = [reply.error for reply in replies if reply.has_error()]
    assert [(e.code, e.reason) for e in errors] == [
        (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ZeroDivisionError: division by zero")
    ]
    assert sum(reply.has_content() for reply in replies) == 2


async def test_unknown_message_type_is_an_error_reply() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        return await _ask_all(grid, "evaluate")

    (reply,) = (await fc.simulate(_app(fc.ClientApp(), main), nodes=1, seed=0)).value
    assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "no handler for 'evaluate'" in reply.error.reason


async def test_sync_main_and_sync_handlers_run_in_threads() -> None:
    client = fc.ClientApp()
    loop_thread = threading.get_ident()

    @client.query()
    def query(msg: fc.Message, context: fc.Context) -> fc.Message:
        return _reply(msg, on_loop=int(threading.get_ident() == loop_thread))

    def main(grid: fc.SyncGrid, context: fc.Context) -> list[int]:
        assert threading.get_ident() != loop_thread
        nodes = grid.get_node_ids()
        replies = grid.send_and_receive([fc.Message(fc.RecordDict(), n, "query") for n in nodes])
        return [int(r.content["metrics"]["on_loop"]) for r in replies]  # type: ignore[call-overload]

    assert (await fc.simulate(_app(client, main), nodes=4, seed=0)).value == [0, 0, 0, 0]


async def test_received_arrays_are_read_only_and_configs_are_copies() -> None:
    client = fc.ClientApp()

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        w = msg.content["arrays"]["w"]
        msg.content["config"]["lr"] = 99.0
        try:
            w += 1
        except ValueError as exc:
            return _reply(msg, read_only=int("read-only" in str(exc)))
        return _reply(msg, read_only=0)

    w = np.zeros(3)
    config = fc.ConfigRecord({"lr": 0.1})

    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "config": config})
        nodes = await grid.get_node_ids()
        return await grid.send_and_receive([fc.Message(content, n, "train") for n in nodes])

    replies = (await fc.simulate(_app(client, main), nodes=2, seed=0)).value
    assert [r.content["metrics"]["read_only"] for r in replies] == [1, 1]
    assert config["lr"] == 0.1
    assert w.flags.writeable
    assert not w.any()


async def test_messages_to_one_node_are_served_in_order_one_at_a_time() -> None:
    client = fc.ClientApp()
    active: list[int] = []
    order: list[int] = []

    @client.query()
    async def query(msg: fc.Message, context: fc.Context) -> fc.Message:
        active.append(1)
        assert len(active) == 1
        order.append(int(msg.content["config"]["i"]))  # type: ignore[call-overload]
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        active.pop()
        return _reply(msg)

    async def main(grid: fc.Grid, context: fc.Context) -> None:
        (node,) = await grid.get_node_ids()
        messages = [
            fc.Message(fc.RecordDict({"config": fc.ConfigRecord({"i": i})}), node, "query")
            for i in range(5)
        ]
        await grid.send_and_receive(messages)

    await fc.simulate(_app(client, main), nodes=1, seed=0)
    assert order == [0, 1, 2, 3, 4]


async def test_main_exception_propagates_unwrapped() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        raise KeyError("no such thing")

    with pytest.raises(KeyError, match="no such thing"):
        await fc.simulate(_app(fc.ClientApp(), main), nodes=1, seed=0)


async def test_run_simulation_refuses_inside_a_running_loop() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        return None

    with pytest.raises(UsageError, match=r"await fedcore\.simulate"):
        fc.run_simulation(_app(fc.ClientApp(), main), nodes=1)


def test_run_simulation_blocks_and_returns() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> int:
        return len(await grid.get_node_ids())

    assert fc.run_simulation(_app(fc.ClientApp(), main), nodes=12, seed=1).value == 12


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nodes": 0}, "nodes must be a positive number"),
        ({"nodes": 2, "seed": -1}, "seed must be a non-negative int"),
        ({"nodes": 2, "backend": "gpu-cluster"}, "unknown backend 'gpu-cluster'"),
    ],
)
async def test_bad_arguments(options: dict[str, Any], message: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        return None

    with pytest.raises(UsageError, match=message):
        await fc.simulate(_app(fc.ClientApp(), main), **options)


async def test_seed_reaches_an_app_that_declares_one(tmp_path: Path) -> None:
    (tmp_path / "seeded_app_mod.py").write_text(
        "import fedcore as fc\n"
        "server = fc.ServerApp()\n"
        "@server.main()\n"
        "async def main(grid, context):\n"
        "    return context.run_config['seed']\n"
        "client = fc.ClientApp()\n"
    )
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fedcore.app]\nserver = "seeded_app_mod:server"\nclient = "seeded_app_mod:client"\n'
        "[tool.fedcore.app.config]\nseed = 5\n"
    )
    assert (await fc.simulate(tmp_path, nodes=1)).value == 5
    assert (await fc.simulate(tmp_path, nodes=1, seed=9)).value == 9


async def test_client_module_that_fails_to_import_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "broken_client_mod.py").write_text(
        "import fedcore as fc\nimport not_installed_lib\n"
    )
    (tmp_path / "fine_server_mod.py").write_text("import fedcore as fc\nserver = fc.ServerApp()\n")
    (tmp_path / "pyproject.toml").write_text(
        "[tool.fedcore.app]\n"
        'server = "fine_server_mod:server"\n'
        'client = "broken_client_mod:client"\n'
    )
    with pytest.raises(AppLoadError) as caught:
        await fc.simulate(tmp_path, nodes=2)
    text = str(caught.value)
    assert "\n" not in text
    assert "ClientApp 'broken_client_mod:client'" in text
    assert "No module named 'not_installed_lib' (broken_client_mod.py:2)" in text
