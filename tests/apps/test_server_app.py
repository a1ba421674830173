"""ServerApp (async or sync main, its result) and App (a checked ServerApp + ClientApp pair)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import pytest

import fedcore as fc
from fedcore.apps.app import App
from fedcore.apps.client_app import ClientApp
from fedcore.apps.grid import Grid, SyncGrid, reply_filter
from fedcore.apps.server_app import ServerApp
from fedcore.clock import Clock
from fedcore.domain import SERVER_NODE_ID, Context, Message, MetricRecord, RecordDict, Run
from fedcore.testing.clock import FakeClock


class EchoGrid(Grid):
    """A Grid over three nodes that each answer a message with its own content."""

    def __init__(self) -> None:
        self._run = Run(run_id=5, run_config={"rounds": 1})
        self._clock = FakeClock()
        self._replies: dict[str, Message] = {}
        self.pushed: list[Message] = []

    @property
    def run(self) -> Run:
        return self._run

    @property
    def clock(self) -> Clock:
        return self._clock

    async def get_node_ids(self) -> list[int]:
        return [11, 12, 13]

    async def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        return (await self.get_node_ids())[:count]

    async def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.message_id = f"msg-{len(self.pushed)}"
            message.metadata.src_node_id = SERVER_NODE_ID
            self.pushed.append(message)
            self._replies[message.metadata.message_id] = Message(message.content, reply_to=message)
            ids.append(message.metadata.message_id)
        return ids

    async def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        ids = reply_filter(reply_to_message_ids, message_ids)
        return [self._replies.pop(i) for i in list(self._replies if ids is None else ids)
                if i in self._replies]  # fmt: skip

    async def receive(
        self, message_ids: Iterable[str], *, timeout: float | None = None
    ) -> AsyncIterator[Message]:
        for reply in await self.pull_messages(message_ids):
            yield reply


def query(node_id: int, value: int) -> Message:
    return Message(RecordDict({"m": MetricRecord({"v": value})}), node_id, "query")


@pytest.fixture
def server() -> ServerApp:
    return ServerApp()


@pytest.fixture
def grid() -> EchoGrid:
    return EchoGrid()


@pytest.fixture
def context() -> Context:
    return Context(run_id=5, node_id=SERVER_NODE_ID, run_config={"rounds": 1})


# ------------------------------------------------------------------ ServerApp


@pytest.mark.anyio
async def test_an_async_main_gets_the_grid_itself_on_the_loop_thread(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    seen: list[tuple[object, object, int]] = []

    @server.main()
    async def main(grid: Grid, context: Context) -> None:
        seen.append((grid, context, threading.get_ident()))

    await server.run(grid, context)

    assert seen == [(grid, context, threading.get_ident())]


@pytest.mark.anyio
async def test_an_async_main_can_exchange_messages(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    async def main(grid: Grid, context: Context) -> list[Any]:
        nodes = await grid.get_node_ids()
        replies = await grid.send_and_receive([query(n, n) for n in nodes])
        return [reply.content["m"]["v"] for reply in replies]

    assert await server.run(grid, context) == [11, 12, 13]


@pytest.mark.anyio
async def test_a_sync_main_gets_a_sync_grid_in_a_worker_thread(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    seen: list[tuple[object, object, int]] = []

    @server.main()
    def main(grid: SyncGrid, context: Context) -> None:
        seen.append((grid, context, threading.get_ident()))

    await server.run(grid, context)

    [(given, given_context, thread)] = seen
    assert isinstance(given, SyncGrid)
    assert given.async_grid is grid
    assert given.run is grid.run
    assert given_context is context
    assert thread != threading.get_ident()


@pytest.mark.anyio
async def test_a_sync_main_calls_the_grid_by_blocking(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    def main(grid: SyncGrid, context: Context) -> dict[str, Any]:
        nodes = grid.get_node_ids()
        replies = grid.send_and_receive([query(n, n * 2) for n in nodes])
        ids = grid.push_messages([query(11, 1), query(12, 2)])
        streamed = [reply.content["m"]["v"] for reply in grid.receive(ids)]
        return {
            "nodes": nodes,
            "waited": grid.wait_for_nodes(2),
            "replies": [reply.content["m"]["v"] for reply in replies],
            "streamed": streamed,
            "pulled_again": grid.pull_messages(ids),
        }

    assert await server.run(grid, context) == {
        "nodes": [11, 12, 13],
        "waited": [11, 12],
        "replies": [22, 24, 26],
        "streamed": [1, 2],
        "pulled_again": [],
    }


@pytest.mark.anyio
async def test_a_sync_main_pulls_every_reply_and_is_warned_of_the_old_keyword(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    """The blocking grid takes Flower 1.43's pull_messages: no ids for every reply, and
    ``message_ids=`` with a DeprecationWarning that points at the ServerApp's line."""

    @server.main()
    def main(grid: SyncGrid, context: Context) -> dict[str, Any]:
        first = grid.push_messages([query(11, 1), query(12, 2)])
        every = [reply.content["m"]["v"] for reply in grid.pull_messages()]
        (again,) = grid.push_messages([query(13, 3)])
        with pytest.warns(DeprecationWarning, match="deprecated") as warned:
            named = [reply.content["m"]["v"] for reply in grid.pull_messages(message_ids=[again])]
        with pytest.raises(TypeError):
            grid.pull_messages(first, message_ids=first)
        return {
            "every": every,
            "named": named,
            "where": warned[0].filename,
            "left": grid.pull_messages(),
        }

    assert await server.run(grid, context) == {
        "every": [1, 2],
        "named": [3],
        "where": __file__,
        "left": [],
    }


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
async def test_mains_return_value_is_returned(
    server: ServerApp, grid: EchoGrid, context: Context, is_async: bool
) -> None:
    result = object()
    if is_async:

        async def main(grid: Grid, context: Context) -> object:
            return result

        server.main()(main)
    else:
        server.main()(lambda grid, context: result)

    assert await server.run(grid, context) is result


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
async def test_an_exception_in_main_propagates(
    server: ServerApp, grid: EchoGrid, context: Context, is_async: bool
) -> None:
    def fail() -> None:
        raise RuntimeError("aggregation went wrong")

    if is_async:

        async def main(grid: Grid, context: Context) -> None:
            fail()

        server.main()(main)
    else:
        server.main()(lambda grid, context: fail())

    with pytest.raises(RuntimeError, match="aggregation went wrong"):
        await server.run(grid, context)


@pytest.mark.anyio
async def test_a_sync_main_can_change_the_servers_context(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    def main(grid: SyncGrid, context: Context) -> None:
        context.state["final"] = MetricRecord({"accuracy": 0.9})

    await server.run(grid, context)

    assert context.state["final"] == MetricRecord({"accuracy": 0.9})


@pytest.mark.anyio
async def test_running_without_a_main_is_a_type_error(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    with pytest.raises(TypeError, match=r"has no main: decorate one with @server\.main\(\)"):
        await server.run(grid, context)


def test_a_second_main_is_refused(server: ServerApp) -> None:
    server.main()(lambda grid, context: None)

    with pytest.raises(ValueError, match="already has a main"):
        server.main()(lambda grid, context: 1)


def test_a_non_callable_main_is_refused(server: ServerApp) -> None:
    with pytest.raises(TypeError, match="main must be callable"):
        server.main()("main")  # type: ignore[type-var]


def test_the_decorator_returns_main_unchanged(server: ServerApp) -> None:
    def main(grid: SyncGrid, context: Context) -> None:
        return None

    assert server.main()(main) is main


@pytest.mark.anyio
async def test_a_sync_main_drives_a_real_simulation() -> None:
    server, client = ServerApp(), ClientApp()

    @client.query()
    async def answer(msg: Message, context: Context) -> Message:
        partition = context.node_config["partition-id"]
        return Message(RecordDict({"m": MetricRecord({"p": partition})}), reply_to=msg)

    @server.main()
    def main(grid: SyncGrid, context: Context) -> list[Any]:
        nodes = grid.wait_for_nodes(3, timeout=10)
        replies = grid.send_and_receive([query(n, 0) for n in nodes], timeout=10)
        return sorted(reply.content["m"]["p"] for reply in replies)

    result = await fc.simulate(App(server=server, client=client), nodes=3, seed=0, backend="inline")

    assert result.value == [0, 1, 2]
    assert result.seed == 0


# ------------------------------------------------------------------ lifespan


@pytest.mark.anyio
@pytest.mark.parametrize("style", ["flower", "fedcore"])
async def test_a_lifespan_runs_around_main_with_or_without_the_context(
    server: ServerApp, grid: EchoGrid, context: Context, style: str
) -> None:
    events: list[object] = []

    if style == "flower":

        @server.lifespan()
        def lifespan(ctx: Context) -> Iterator[None]:
            events.append(("setup", ctx))
            yield
            events.append("teardown")

    else:

        @server.lifespan()
        def lifespan() -> Iterator[None]:
            events.append(("setup", context))
            yield
            events.append("teardown")

    @server.main()
    async def main(grid: Grid, context: Context) -> int:
        events.append("main")
        return 7

    assert await server.run(grid, context) == 7
    assert events == [("setup", context), "main", "teardown"]


@pytest.mark.anyio
async def test_a_lifespan_tears_down_when_main_raises_and_runs_off_the_loop(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    threads: list[int] = []

    @server.lifespan()
    def lifespan(context: Context) -> Iterator[None]:
        threads.append(threading.get_ident())
        try:
            yield
        finally:
            threads.append(threading.get_ident())

    @server.main()
    def main(grid: SyncGrid, context: Context) -> None:
        raise RuntimeError("main failed")

    with pytest.raises(RuntimeError, match="main failed"):
        await server.run(grid, context)
    assert len(threads) == 2
    assert threading.get_ident() not in threads


def test_a_lifespan_must_be_a_generator_taking_at_most_the_context(server: ServerApp) -> None:
    with pytest.raises(TypeError, match="generator function"):
        server.lifespan()(lambda context: None)  # type: ignore[arg-type, return-value]

    def two(context: Context, extra: int) -> Iterator[None]:
        yield

    with pytest.raises(TypeError, match="no argument or one"):
        server.lifespan()(two)  # type: ignore[arg-type]

    def one() -> Iterator[None]:
        yield

    server.lifespan()(one)
    with pytest.raises(ValueError, match="already has a lifespan"):
        server.lifespan()(one)


# ------------------------------------------------------------------ calling the app


@pytest.mark.parametrize("style", ["flower", "fedcore"])
def test_calling_the_app_runs_main_with_the_grid_given_inside_the_lifespan(
    server: ServerApp, context: Context, style: str
) -> None:
    """``server(grid, context)`` is Flower's form: the grid goes to main as it is."""
    events: list[object] = []
    stand_in = object()

    if style == "flower":

        @server.lifespan()
        def lifespan(ctx: Context) -> Iterator[None]:
            events.append(("setup", ctx))
            yield
            events.append("teardown")

    else:

        @server.lifespan()
        def lifespan() -> Iterator[None]:
            events.append(("setup", context))
            yield
            events.append("teardown")

    @server.main()
    def main(grid: Any, ctx: Context) -> int:
        events.append(("main", grid, ctx))
        return 7

    assert server(stand_in, context) == 7
    assert events == [("setup", context), ("main", stand_in, context), "teardown"]


def test_calling_the_app_tears_down_and_raises_when_main_raises(
    server: ServerApp, context: Context
) -> None:
    events: list[str] = []

    @server.lifespan()
    def lifespan(ctx: Context) -> Iterator[None]:
        try:
            yield
        finally:
            events.append("teardown")

    @server.main()
    def main(grid: Any, ctx: Context) -> None:
        raise RuntimeError("main failed")

    with pytest.raises(RuntimeError, match="main failed"):
        server(None, context)
    assert events == ["teardown"]


def test_calling_the_app_runs_an_async_main_on_a_loop_of_its_own(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    async def main(grid: Grid, ctx: Context) -> list[int]:
        return await grid.get_node_ids()

    assert server(grid, context) == [11, 12, 13]


@pytest.mark.anyio
async def test_calling_the_app_on_a_running_loop_refuses_an_async_main(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    async def main(grid: Grid, ctx: Context) -> None:
        return None

    with pytest.raises(TypeError, match=r"await server\.run"):
        server(grid, context)


def test_calling_an_app_without_main_is_a_type_error(server: ServerApp, context: Context) -> None:
    with pytest.raises(TypeError, match="no main"):
        server(None, context)


# ------------------------------------------------------------------ Grid.create_message


def test_create_message_fills_in_the_run_and_the_sender(grid: EchoGrid) -> None:
    content = RecordDict({"m": MetricRecord({"v": 1})})
    message = grid.create_message(content, fc.MessageType.QUERY, 12, "round-2", ttl=30)
    meta = message.metadata
    assert message.content is content
    assert (meta.run_id, meta.src_node_id, meta.dst_node_id) == (5, SERVER_NODE_ID, 12)
    assert (meta.message_type, meta.group_id, meta.ttl, meta.message_id) == (
        "query",
        "round-2",
        30.0,
        "",
    )
    assert grid.create_message(content, "train", 12, "").metadata.ttl == fc.domain.DEFAULT_TTL
    with pytest.raises(ValueError, match="message_type"):
        grid.create_message(content, "fit", 12, "")


@pytest.mark.anyio
async def test_a_sync_grid_creates_messages_too(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    @server.main()
    def main(grid: SyncGrid, context: Context) -> list[Any]:
        content = RecordDict({"m": MetricRecord({"v": 3})})
        messages = [grid.create_message(content, "query", n, "g") for n in grid.get_node_ids()]
        return [r.content["m"]["v"] for r in grid.send_and_receive(messages)]

    assert await server.run(grid, context) == [3, 3, 3]


# ------------------------------------------------------------------ App


def test_an_app_holds_its_two_halves() -> None:
    server, client = ServerApp(), ClientApp()

    app = App(server=server, client=client)

    assert app.server is server
    assert app.client is client


def test_an_app_is_immutable() -> None:
    app = App(server=ServerApp(), client=ClientApp())

    with pytest.raises(dataclasses.FrozenInstanceError):
        app.server = ServerApp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("server", "client", "message"),
    [
        (ClientApp(), ClientApp(), r"App\(server=\.\.\.\) must be a ServerApp, got ClientApp"),
        (ServerApp(), ServerApp(), r"App\(client=\.\.\.\) must be a ClientApp, got ServerApp"),
        (None, ClientApp(), r"App\(server=\.\.\.\) must be a ServerApp, got NoneType"),
        (ServerApp(), "client:app", r"App\(client=\.\.\.\) must be a ClientApp, got str"),
    ],
    ids=["client-as-server", "server-as-client", "none-server", "string-client"],
)
def test_an_app_checks_the_types_of_its_halves(server: Any, client: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        App(server=server, client=client)


def test_the_public_api_exports_the_app_classes() -> None:
    assert fc.App is App
    assert fc.ServerApp is ServerApp
    assert fc.ClientApp is ClientApp
    assert fc.Grid is Grid


@pytest.mark.anyio
async def test_a_sync_main_may_call_the_grid_from_threads_of_its_own(
    server: ServerApp, grid: EchoGrid, context: Context
) -> None:
    # The legacy server calls its clients from a thread pool, each call a blocking one.
    @server.main()
    def main(grid: SyncGrid, context: Context) -> list[int]:
        def ask(node_id: int) -> int:
            [reply] = grid.send_and_receive([query(node_id, node_id * 3)])
            value: int = reply.content["m"]["v"]
            return value

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            return sorted(pool.map(ask, grid.get_node_ids()))

    assert await server.run(grid, context) == [33, 36, 39]
