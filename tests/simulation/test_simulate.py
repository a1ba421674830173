"""The simulation runtime end to end, through the public API, on every backend.

The ClientApps live at module level: the process backend imports them again, by
name, in its workers. ServerApps run in this process and may be made anywhere.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import ErrorCode
from fedcore.errors import AppLoadError, UsageError
from fedcore.testing.backends import backend_params

pytestmark = pytest.mark.anyio


def _reply(msg: fc.Message, **metrics: int | float | list[int]) -> fc.Message:
    return fc.Message(fc.RecordDict({"metrics": fc.MetricRecord(metrics)}), reply_to=msg)


contract = fc.ClientApp()


@contract.query("count")
def count(msg: fc.Message, context: fc.Context) -> fc.Message:
    calls = context.state.setdefault("calls", fc.MetricRecord({"n": 0}))
    calls["n"] = int(calls["n"]) + 1  # type: ignore[call-overload]
    return _reply(
        msg,
        partition=context.node_config["partition-id"],
        partitions=context.node_config["num-partitions"],
        calls=calls["n"],
    )


@contract.train()
async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    if context.node_config["partition-id"] == 1:
        raise ZeroDivisionError("division by zero")
    return _reply(msg, ok=1)


@contract.query("arrays")
def arrays(msg: fc.Message, context: fc.Context) -> fc.Message:
    w = msg.content["arrays"]["w"]
    msg.content["config"]["lr"] = 99.0
    try:
        w += 1
    except ValueError as exc:
        return _reply(msg, read_only=int("read-only" in str(exc)), total=float(w.sum()))
    return _reply(msg, read_only=0, total=float(w.sum()))


@contract.query("order")
def order(msg: fc.Message, context: fc.Context) -> fc.Message:
    seen = context.state.setdefault("seen", fc.MetricRecord({"i": []}))
    seen["i"] = [*seen["i"], msg.content["config"]["i"]]  # type: ignore[list-item, misc]
    return _reply(msg, seen=seen["i"])  # type: ignore[arg-type]


@contract.query("head")
def head(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Keeps an ArrayRecord in its state, as Flower's advanced-pytorch keeps a layer."""
    state = context.state
    w = state["head"]["w"] + 1 if "head" in state else np.zeros(2, dtype=np.float32)
    state["head"] = fc.ArrayRecord({"w": w})
    return _reply(msg, w=[float(x) for x in w])


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _app(main: Any, client: fc.ClientApp = contract) -> fc.App:
    server = fc.ServerApp()
    server.main()(main)
    return fc.App(server=server, client=client)


async def _ask_all(
    grid: fc.Grid, message_type: str, content: fc.RecordDict | None = None
) -> list[fc.Message]:
    nodes = await grid.get_node_ids()
    body = content if content is not None else fc.RecordDict()
    return await grid.send_and_receive([fc.Message(body, node, message_type) for node in nodes])


async def test_value_and_server_context(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> str:
        context.state["seen"] = fc.MetricRecord({"nodes": len(await grid.get_node_ids())})
        return "done"

    result = await fc.simulate(_app(main), nodes=7, run_config={"x": 1}, seed=3, backend=backend)
    assert result.value == "done"
    assert result.seed == 3
    assert result.context.run_config == {"x": 1}
    assert result.context.state["seen"]["nodes"] == 7


async def test_node_config_and_state_persist_across_rounds(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[list[fc.Message]]:
        return [await _ask_all(grid, "query.count") for _ in range(3)]

    rounds = (await fc.simulate(_app(main), nodes=5, seed=0, backend=backend)).value
    last = [reply.content["metrics"] for reply in rounds[-1]]
    assert sorted(m["partition"] for m in last) == [0, 1, 2, 3, 4]
    assert {m["partitions"] for m in last} == {5}
    assert {m["calls"] for m in last} == {3}


async def test_an_array_record_in_the_state_persists_across_rounds(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[list[fc.Message]]:
        return [await _ask_all(grid, "query.head") for _ in range(3)]

    rounds = (await fc.simulate(_app(main), nodes=2, seed=0, backend=backend)).value
    assert [[reply.content["metrics"]["w"] for reply in replies] for replies in rounds] == [
        [[0.0, 0.0]] * 2,
        [[1.0, 1.0]] * 2,
        [[2.0, 2.0]] * 2,
    ]


async def test_client_exception_becomes_error_reply(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        return await _ask_all(grid, "train")

    replies = (await fc.simulate(_app(main), nodes=3, seed=0, backend=backend)).value
    errors = [reply.error for reply in replies if reply.has_error()]
    assert [(e.code, e.reason) for e in errors] == [
        (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ZeroDivisionError: division by zero")
    ]
    assert sum(reply.has_content() for reply in replies) == 2


async def test_unknown_message_type_is_an_error_reply(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        return await _ask_all(grid, "evaluate")

    (reply,) = (await fc.simulate(_app(main), nodes=1, seed=0, backend=backend)).value
    assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "no handler for 'evaluate'" in reply.error.reason


@pytest.mark.parametrize("size", [3, 100_000])
async def test_received_arrays_are_read_only_and_configs_are_copies(
    backend: str, size: int
) -> None:
    """Small contents travel inline, large ones through shared memory: both read-only."""
    w = np.ones(size)
    config = fc.ConfigRecord({"lr": 0.1})

    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": w}), "config": config})
        return await _ask_all(grid, "query.arrays", content)

    replies = (await fc.simulate(_app(main), nodes=2, seed=0, backend=backend)).value
    assert [r.content["metrics"]["read_only"] for r in replies] == [1, 1]
    assert [r.content["metrics"]["total"] for r in replies] == [float(size)] * 2
    assert config["lr"] == 0.1
    assert w.flags.writeable
    assert (w == 1).all()


async def test_messages_to_one_node_are_served_in_order_one_at_a_time(backend: str) -> None:
    """Each message sees the state the previous one left: one at a time, in order."""

    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        (node,) = await grid.get_node_ids()
        messages = [
            fc.Message(fc.RecordDict({"config": fc.ConfigRecord({"i": i})}), node, "query.order")
            for i in range(5)
        ]
        return await grid.send_and_receive(messages)

    replies = (await fc.simulate(_app(main), nodes=1, seed=0, backend=backend)).value
    assert max((r.content["metrics"]["seen"] for r in replies), key=len) == [0, 1, 2, 3, 4]


async def test_main_exception_propagates_unwrapped(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        raise KeyError("no such thing")

    with pytest.raises(KeyError, match="no such thing"):
        await fc.simulate(_app(main), nodes=1, seed=0, backend=backend)


def test_run_simulation_blocks_and_returns(backend: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> int:
        return len(await grid.get_node_ids())

    assert fc.run_simulation(_app(main), nodes=12, seed=1, backend=backend).value == 12


async def test_sync_main_and_sync_handlers_run_in_threads_inline() -> None:
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

    result = await fc.simulate(_app(main, client), nodes=4, seed=0, backend="inline")
    assert result.value == [0, 0, 0, 0]


async def test_run_simulation_refuses_inside_a_running_loop() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        return None

    with pytest.raises(UsageError, match=r"await fedcore\.simulate"):
        fc.run_simulation(_app(main), nodes=1)


async def test_the_process_backend_needs_an_importable_client_app() -> None:
    client = fc.ClientApp()

    @client.query()
    def query(msg: fc.Message, context: fc.Context) -> fc.Message:
        return msg

    async def main(grid: fc.Grid, context: fc.Context) -> None:
        return None

    with pytest.raises(
        UsageError, match="define it at module level in a file, or use backend='inline'"
    ):
        await fc.simulate(_app(main, client), nodes=1, backend="process")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nodes": 0}, "nodes must be a positive number"),
        ({"nodes": 2, "seed": -1}, "seed must be a non-negative int"),
        ({"nodes": 2, "backend": "gpu-cluster"}, "unknown backend 'gpu-cluster'"),
        ({"nodes": 2, "max_workers": 0}, "max_workers must be at least 1"),
        (
            {"nodes": 2, "resources": fc.Resources(num_gpus=1), "system": fc.Resources(4, 0)},
            "asks for 1 GPUs but this machine has no GPU",
        ),
    ],
)
async def test_bad_arguments(options: dict[str, Any], message: str) -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        return None

    with pytest.raises(UsageError, match=message):
        await fc.simulate(_app(main), **options)


def _write_app(directory: Path, server: str, client: str, config: str = "") -> None:
    (directory / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = "{server}"\nclient = "{client}"\n{config}'
    )


async def test_seed_reaches_an_app_that_declares_one(tmp_path: Path, backend: str) -> None:
    (tmp_path / "seeded_app_mod.py").write_text(
        "import fedcore as fc\n"
        "server = fc.ServerApp()\n"
        "@server.main()\n"
        "async def main(grid, context):\n"
        "    return context.run_config['seed']\n"
        "client = fc.ClientApp()\n"
    )
    _write_app(
        tmp_path,
        "seeded_app_mod:server",
        "seeded_app_mod:client",
        "[tool.fedcore.app.config]\nseed = 5\n",
    )
    assert (await fc.simulate(tmp_path, nodes=1, backend=backend)).value == 5
    assert (await fc.simulate(tmp_path, nodes=1, seed=9, backend=backend)).value == 9


async def test_client_module_that_fails_to_import_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "broken_client_mod.py").write_text(
        "import fedcore as fc\nimport not_installed_lib\n"
    )
    (tmp_path / "fine_server_mod.py").write_text("import fedcore as fc\nserver = fc.ServerApp()\n")
    _write_app(tmp_path, "fine_server_mod:server", "broken_client_mod:client")
    with pytest.raises(AppLoadError) as caught:
        await fc.simulate(tmp_path, nodes=2)
    text = str(caught.value)
    assert "\n" not in text
    assert "ClientApp 'broken_client_mod:client'" in text
    assert "No module named 'not_installed_lib' (broken_client_mod.py:2)" in text
