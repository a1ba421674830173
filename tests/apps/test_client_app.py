"""ClientApp: handler registration, routing, and error replies instead of exceptions."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from fedcore.apps.client_app import ClientApp
from fedcore.domain import (
    ConfigRecord,
    Context,
    Error,
    ErrorCode,
    Message,
    MetricRecord,
    RecordDict,
)

NODE_ID = 7
LOGGER = "fedcore.apps.client_app"


def delivered(message_type: str = "train", message_id: str = "m1") -> Message:
    """A message as a node receives it: stamped with an id by the LinkState."""
    message = Message(RecordDict({"config": ConfigRecord({"lr": 0.1})}), NODE_ID, message_type)
    message.metadata.message_id = message_id
    message.metadata.run_id = 3
    message.metadata.src_node_id = 1
    return message


def ok_reply(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"n": 1})}), reply_to=msg)


def failing(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"x": 1 / 0})}), reply_to=msg)


@pytest.fixture
def client() -> ClientApp:
    return ClientApp()


@pytest.fixture
def context() -> Context:
    return Context(run_id=3, node_id=NODE_ID, node_config={"partition-id": 0})


def assert_error(reply: Message, *fragments: str) -> str:
    assert reply.has_error()
    assert reply.error.code == 2
    assert ErrorCode(reply.error.code) is ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    for fragment in fragments:
        assert fragment in reply.error.reason
    return reply.error.reason


# ------------------------------------------------------------------ registration


@pytest.mark.parametrize("kind", ["train", "evaluate", "query"])
def test_each_decorator_registers_its_message_type(client: ClientApp, kind: str) -> None:
    getattr(client, kind)()(ok_reply)

    assert client.message_types == [kind]


def test_an_action_name_makes_a_dotted_message_type(client: ClientApp) -> None:
    client.train("fast")(ok_reply)

    assert client.message_types == ["train.fast"]


def test_the_decorator_returns_the_handler_unchanged(client: ClientApp) -> None:
    assert client.evaluate()(ok_reply) is ok_reply


def test_message_types_keep_registration_order(client: ClientApp) -> None:
    client.query()(ok_reply)
    client.train()(ok_reply)
    client.train("fast")(ok_reply)

    assert client.message_types == ["query", "train", "train.fast"]


def test_decorator_without_parentheses_is_a_type_error(client: ClientApp) -> None:
    with pytest.raises(TypeError, match=r"use @client\.train\(\) with parentheses"):
        client.train(ok_reply)  # type: ignore[arg-type]


def test_a_second_handler_for_the_same_type_is_refused(client: ClientApp) -> None:
    client.train()(ok_reply)

    with pytest.raises(ValueError, match="a train handler is already registered"):
        client.train()(failing)
    assert client.message_types == ["train"]


def test_the_same_action_on_another_kind_is_a_different_type(client: ClientApp) -> None:
    client.train("fast")(ok_reply)
    client.evaluate("fast")(ok_reply)

    assert client.message_types == ["train.fast", "evaluate.fast"]


@pytest.mark.parametrize(
    "handler",
    [
        lambda msg: msg,
        lambda msg, context, extra: msg,
        lambda: None,
    ],
    ids=["one-argument", "three-arguments", "no-arguments"],
)
def test_a_handler_that_cannot_take_msg_and_context_is_refused(
    client: ClientApp, handler: Callable[..., Any]
) -> None:
    with pytest.raises(TypeError, match=r"a train handler takes \(msg, context\); '<lambda>'"):
        client.train()(handler)
    assert client.message_types == []


def test_a_handler_with_extra_optional_parameters_is_accepted(client: ClientApp) -> None:
    def handler(msg: Message, context: Context, *, verbose: bool = False) -> Message:
        return ok_reply(msg, context)

    client.train()(handler)

    assert client.message_types == ["train"]


def test_a_non_callable_handler_is_refused(client: ClientApp) -> None:
    with pytest.raises(TypeError, match="a train handler must be callable"):
        client.train()(42)  # type: ignore[type-var]


@pytest.mark.parametrize(
    "action", ["bad name", "", ".x", "a/b", "fast.er", "no-hyphen", "123", "nest.nest"]
)
def test_a_bad_action_name_is_a_value_error(client: ClientApp, action: str) -> None:
    """An action is a Python identifier (Flower's rule)."""
    with pytest.raises(ValueError, match=r"an action that is a Python identifier"):
        client.train(action)


def test_the_default_action_is_the_handler_without_one(client: ClientApp, context: Context) -> None:
    client.train("default")(ok_reply)
    assert client.message_types == ["train"]
    with pytest.raises(ValueError, match="already registered"):
        client.train()(ok_reply)
    assert client(delivered("train.default"), context).has_content()


# ------------------------------------------------------------------ calling the app


def test_calling_the_app_returns_what_the_handler_returns(
    client: ClientApp, context: Context
) -> None:
    """``app(msg, context)`` is Flower's: no reply check, so a test may pass stand-ins."""
    sentinel = object()
    seen: list[tuple[Message, Context]] = []

    @client.evaluate("full")
    def evaluate(msg: Message, ctx: Context) -> Any:
        seen.append((msg, ctx))
        return sentinel

    msg = delivered("evaluate.full")
    assert client(msg, context) is sentinel
    assert seen == [(msg, context)]


def test_calling_the_app_raises_what_the_handler_raises(
    client: ClientApp, context: Context
) -> None:
    client.train()(failing)
    with pytest.raises(ZeroDivisionError):
        client(delivered(), context)


def test_calling_the_app_with_a_type_it_does_not_handle_is_a_value_error(
    client: ClientApp, context: Context
) -> None:
    client.train()(ok_reply)
    with pytest.raises(ValueError, match=r"no handler for 'query'.*it handles: train"):
        client(delivered("query"), context)


def test_calling_the_app_finishes_an_async_handler(client: ClientApp, context: Context) -> None:
    @client.query()
    async def query(msg: Message, ctx: Context) -> Message:
        await asyncio.sleep(0)
        return ok_reply(msg, ctx)

    reply = client(delivered("query"), context)
    assert reply.content.metric_records["metrics"]["n"] == 1


@pytest.mark.anyio
async def test_calling_the_app_on_a_running_loop_cannot_finish_an_async_handler(
    client: ClientApp, context: Context
) -> None:
    @client.query()
    async def query(msg: Message, ctx: Context) -> Message:
        return ok_reply(msg, ctx)

    with pytest.raises(TypeError, match=r"await app\.handle"):
        client(delivered("query"), context)


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["call", "handle"])
async def test_a_handlers_own_mods_run_inside_the_apps_and_only_for_it(
    context: Context, how: str
) -> None:
    trace: list[str] = []

    def tracing(name: str) -> Any:
        def mod(msg: Message, ctx: Context, call_next: Callable[..., Message]) -> Message:
            trace.append(f"{name} in")
            reply = call_next(msg, ctx)
            trace.append(f"{name} out")
            return reply

        return mod

    client = ClientApp(mods=[tracing("app")])

    @client.train(mods=[tracing("own")])
    def train(msg: Message, ctx: Context) -> Message:
        trace.append("train")
        return ok_reply(msg, ctx)

    client.evaluate()(ok_reply)

    def run(msg: Message) -> Any:
        if how == "call":
            return client(msg, context)
        return client.handle(msg, context, in_thread=True)

    for msg in (delivered("train"), delivered("evaluate")):
        reply = run(msg)
        reply = await reply if how == "handle" else reply
        assert reply.has_content()
    assert trace == ["app in", "own in", "train", "own out", "app out", "app in", "app out"]


def test_a_handlers_own_mods_are_checked_as_the_apps_are(client: ClientApp) -> None:
    with pytest.raises(TypeError, match=r"mods\[0\].*must take \(msg, context, call_next\)"):
        client.train(mods=[lambda msg: msg])  # type: ignore[list-item]


# ------------------------------------------------------------------ handling


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_a_plain_def_handler_answers(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    client.train()(ok_reply)
    msg = delivered()

    reply = await client.handle(msg, context, in_thread=in_thread)

    assert reply.has_content()
    assert reply.content["metrics"] == MetricRecord({"n": 1})
    assert reply.metadata.reply_to_message_id == "m1"
    assert reply.metadata.dst_node_id == 1
    assert reply.metadata.src_node_id == NODE_ID


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_an_async_handler_answers(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    @client.evaluate()
    async def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"acc": 0.5})}), reply_to=msg)

    reply = await client.handle(delivered("evaluate"), context, in_thread=in_thread)

    assert reply.content["metrics"] == MetricRecord({"acc": 0.5})


@pytest.mark.anyio
async def test_in_thread_runs_a_plain_handler_off_the_event_loop_thread(
    client: ClientApp, context: Context
) -> None:
    threads: list[int] = []

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        threads.append(threading.get_ident())
        return ok_reply(msg, context)

    await client.handle(delivered(), context, in_thread=True)
    await client.handle(delivered(message_id="m2"), context, in_thread=False)

    assert threads[0] != threading.get_ident()
    assert threads[1] == threading.get_ident()


@pytest.mark.anyio
async def test_an_async_handler_runs_on_the_loop_even_with_in_thread(
    client: ClientApp, context: Context
) -> None:
    threads: list[int] = []

    @client.train()
    async def train(msg: Message, context: Context) -> Message:
        threads.append(threading.get_ident())
        return ok_reply(msg, context)

    await client.handle(delivered(), context, in_thread=True)

    assert threads == [threading.get_ident()]


class AsyncCallable:
    """A handler object whose ``__call__`` is a coroutine function."""

    async def __call__(self, msg: Message, context: Context) -> Message:
        return ok_reply(msg, context)


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_an_object_with_an_async_call_is_awaited(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    client.train()(AsyncCallable())

    reply = await client.handle(delivered(), context, in_thread=in_thread)

    assert reply.has_content()


@pytest.mark.anyio
async def test_the_action_handler_answers_its_dotted_type(
    client: ClientApp, context: Context
) -> None:
    client.train()(failing)
    client.train("fast")(ok_reply)

    reply = await client.handle(delivered("train.fast"), context, in_thread=False)

    assert reply.has_content()
    assert reply.metadata.message_type == "train.fast"


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_context_state_changes_persist_on_the_context_passed(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    @client.train()
    def train(msg: Message, context: Context) -> Message:
        seen = context.state.get("seen")
        count = 0 if seen is None else seen["count"]
        assert isinstance(count, int)
        context.state["seen"] = MetricRecord({"count": count + 1})
        return ok_reply(msg, context)

    for message_id in ("m1", "m2", "m3"):
        await client.handle(delivered(message_id=message_id), context, in_thread=in_thread)

    assert context.state["seen"] == MetricRecord({"count": 3})


@pytest.mark.anyio
async def test_the_handler_receives_the_message_and_context_given(
    client: ClientApp, context: Context
) -> None:
    received: list[tuple[Message, Context]] = []

    @client.query()
    def query(msg: Message, context: Context) -> Message:
        received.append((msg, context))
        return ok_reply(msg, context)

    msg = delivered("query")
    await client.handle(msg, context, in_thread=True)

    assert len(received) == 1
    assert received[0][0] is msg
    assert received[0][1] is context


@pytest.mark.anyio
async def test_a_handler_may_reply_with_an_error_of_its_own(
    client: ClientApp, context: Context
) -> None:
    @client.train()
    def train(msg: Message, context: Context) -> Message:
        return Message(error=Error(0, "no data on this node"), reply_to=msg)

    reply = await client.handle(delivered(), context, in_thread=False)

    assert reply.error == Error(0, "no data on this node")


# ------------------------------------------------------------------ error replies


@pytest.mark.anyio
async def test_an_unknown_message_type_gets_an_error_naming_the_handled_types(
    client: ClientApp, context: Context
) -> None:
    client.train()(ok_reply)
    client.evaluate("full")(ok_reply)

    reply = await client.handle(delivered("query"), context, in_thread=False)

    assert_error(reply, "no handler for 'query'", "(it handles: train, evaluate.full)")
    assert reply.metadata.reply_to_message_id == "m1"


@pytest.mark.anyio
async def test_an_app_without_handlers_says_it_handles_none(
    client: ClientApp, context: Context
) -> None:
    reply = await client.handle(delivered(), context, in_thread=False)

    assert_error(reply, "(it handles: none)")


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_an_exception_becomes_an_error_reply_with_its_text(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    client.train()(failing)

    reply = await client.handle(delivered(), context, in_thread=in_thread)

    assert assert_error(reply) == "ZeroDivisionError: division by zero"
    assert reply.metadata.reply_to_message_id == "m1"


@pytest.mark.anyio
async def test_an_async_handler_exception_becomes_an_error_reply(
    client: ClientApp, context: Context
) -> None:
    @client.train()
    async def train(msg: Message, context: Context) -> Message:
        raise KeyError("features")

    reply = await client.handle(delivered(), context, in_thread=False)

    assert assert_error(reply) == "KeyError: 'features'"


@pytest.mark.anyio
async def test_an_exception_without_text_is_reported_by_its_type(
    client: ClientApp, context: Context
) -> None:
    @client.train()
    def train(msg: Message, context: Context) -> Message:
        raise AssertionError

    reply = await client.handle(delivered(), context, in_thread=False)

    assert assert_error(reply) == "AssertionError"


@pytest.mark.anyio
async def test_the_first_failure_is_a_warning_with_traceback_later_ones_debug(
    client: ClientApp, context: Context, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    client.train()(failing)

    for message_id in ("m1", "m2", "m3"):
        await client.handle(delivered(message_id=message_id), context, in_thread=False)

    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    first = records[0]
    assert "train handler raised on node 7" in first.getMessage()
    assert first.exc_info is not None
    assert first.exc_info[0] is ZeroDivisionError
    assert "ZeroDivisionError: division by zero" in caplog.text
    assert "in failing" in caplog.text  # the handler's frame is in the traceback


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("returned", "type_name"),
    [(None, "NoneType"), (RecordDict(), "RecordDict"), ({"a": 1}, "dict")],
)
async def test_a_wrong_return_type_becomes_an_explaining_error_reply(
    client: ClientApp, context: Context, returned: object, type_name: str
) -> None:
    client.train()(lambda msg, context: returned)  # type: ignore[type-var]

    reply = await client.handle(delivered(), context, in_thread=False)

    assert_error(reply, f"the train handler returned {type_name}", "Message(content, reply_to=msg)")


@pytest.mark.anyio
async def test_a_reply_to_another_message_becomes_an_error_reply(
    client: ClientApp, context: Context
) -> None:
    other = delivered(message_id="m2")
    client.train()(lambda msg, context: ok_reply(other, context))

    reply = await client.handle(delivered(message_id="m1"), context, in_thread=False)

    assert_error(reply, "returned a Message that is not a reply to its message")
    assert reply.metadata.reply_to_message_id == "m1"


@pytest.mark.anyio
async def test_returning_the_incoming_message_becomes_an_error_reply(
    client: ClientApp, context: Context
) -> None:
    client.train()(lambda msg, context: msg)

    reply = await client.handle(delivered(), context, in_thread=False)

    assert_error(reply, "not a reply to its message")


@pytest.mark.anyio
async def test_error_replies_do_not_stop_later_messages(
    client: ClientApp, context: Context
) -> None:
    calls: list[str] = []

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        calls.append(msg.metadata.message_id)
        if len(calls) == 1:
            raise RuntimeError("first one fails")
        return ok_reply(msg, context)

    first = await client.handle(delivered(message_id="m1"), context, in_thread=True)
    second = await client.handle(delivered(message_id="m2"), context, in_thread=True)

    assert first.has_error()
    assert second.has_content()


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [True, False])
async def test_sys_exit_in_a_handler_fails_only_its_reply(
    client: ClientApp, context: Context, in_thread: bool
) -> None:
    @client.train()
    def train(msg: Message, context: Context) -> Message:
        sys.exit(3)

    reply = await client.handle(delivered(), context, in_thread=in_thread)
    assert assert_error(reply) == "SystemExit: 3"


def test_handle_blocking_runs_plain_and_async_handlers(client: ClientApp, context: Context) -> None:
    """What a process-pool worker calls: plain handlers directly, async ones through ``run``."""

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        return ok_reply(msg, context)

    @client.evaluate()
    async def evaluate(msg: Message, context: Context) -> Message:
        return ok_reply(msg, context)

    runs: list[object] = []

    def run(awaitable: Any) -> Message:
        runs.append(awaitable)
        return asyncio.run(awaitable)

    assert client.handle_blocking(delivered("train"), context, run).has_content()
    assert runs == []
    assert client.handle_blocking(delivered("evaluate"), context, run).has_content()
    assert len(runs) == 1


def test_handle_blocking_answers_failures_with_error_replies(
    client: ClientApp, context: Context
) -> None:
    client.train()(failing)

    def never(awaitable: Any) -> Message:
        raise AssertionError("nothing to await")

    assert_error(client.handle_blocking(delivered("train"), context, never), "ZeroDivisionError")
    assert_error(client.handle_blocking(delivered("query"), context, never), "no handler")
