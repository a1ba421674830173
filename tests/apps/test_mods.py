"""ClientApp mods on every path, and the mods fedcore ships (clipping, message stats)."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio.to_thread
import numpy as np
import pytest

from fedcore.apps.client_app import CallNext, ClientApp, Handler
from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from fedcore.mods import fixedclipping_mod, message_stats_mod
from fedcore.strategy import FedAvg
from fedcore.wire import pack_message
from fedcore.wire.message import encoded_size

pytestmark = pytest.mark.anyio

NODE_ID = 7

Runner = Callable[[ClientApp, Message, Context], Awaitable[Message]]


async def on_thread(client: ClientApp, msg: Message, context: Context) -> Message:
    """As the inline backend runs a ClientApp."""
    return await client.handle(msg, context, in_thread=True)


async def on_loop(client: ClientApp, msg: Message, context: Context) -> Message:
    return await client.handle(msg, context, in_thread=False)


async def blocking(client: ClientApp, msg: Message, context: Context) -> Message:
    """As a process-pool worker runs a ClientApp: its own thread and its own loop."""

    def work() -> Message:
        loop = asyncio.new_event_loop()
        try:
            return client.handle_blocking(msg, context, loop.run_until_complete)
        finally:
            loop.close()

    return await anyio.to_thread.run_sync(work)


RUNNERS = [on_thread, on_loop, blocking]


@pytest.fixture(params=RUNNERS, ids=lambda runner: runner.__name__)
def run(request: pytest.FixtureRequest) -> Runner:
    runner: Runner = request.param
    return runner


@pytest.fixture(params=["def", "async def"])
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def context() -> Context:
    return Context(run_id=3, node_id=NODE_ID, node_config={})


def delivered(
    content: RecordDict | None = None, message_type: str = "train", message_id: str = "m1"
) -> Message:
    """A message as a node receives it: stamped with an id by the LinkState."""
    body = content if content is not None else RecordDict({"config": ConfigRecord({"lr": 0.1})})
    message = Message(body, NODE_ID, message_type)
    message.metadata.message_id = message_id
    message.metadata.run_id = 3
    message.metadata.src_node_id = 1
    return message


def reply_with(msg: Message, **metrics: int | float) -> Message:
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def answer(msg: Message, context: Context) -> Message:
    return reply_with(msg, n=1)


def make_handler(kind: str, body: Callable[[Message, Context], Message]) -> Handler:
    """``body`` as a plain or an ``async def`` handler."""
    if kind == "def":
        return body

    async def handler(msg: Message, context: Context) -> Message:
        return body(msg, context)

    return handler


def app(kind: str, body: Callable[[Message, Context], Message], *mods: Any) -> ClientApp:
    client = ClientApp(mods=list(mods))
    client.train()(make_handler(kind, body))
    return client


def assert_error(reply: Message, *fragments: str) -> None:
    assert reply.has_error()
    assert reply.error.code == 2
    for fragment in fragments:
        assert fragment in reply.error.reason
    assert reply.metadata.reply_to_message_id == "m1"


# ------------------------------------------------------------------ the chain


def tracing(name: str, trace: list[str]) -> Callable[[Message, Context, CallNext], Message]:
    def mod(msg: Message, context: Context, call_next: CallNext) -> Message:
        trace.append(f"{name} in")
        reply = call_next(msg, context)
        trace.append(f"{name} out")
        return reply

    return mod


async def test_the_first_mod_is_the_outermost(run: Runner, kind: str, context: Context) -> None:
    trace: list[str] = []

    def body(msg: Message, context: Context) -> Message:
        trace.append("handler")
        return reply_with(msg, n=1)

    client = app(kind, body, tracing("a", trace), tracing("b", trace))
    reply = await run(client, delivered(), context)

    assert reply.content["metrics"] == MetricRecord({"n": 1})
    assert trace == ["a in", "b in", "handler", "b out", "a out"]


def scale_lr(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Hands the handler a message with a changed config, and marks the reply."""
    config = ConfigRecord({"lr": float(msg.content["config"]["lr"]) * 10})  # type: ignore[arg-type]
    reply = call_next(msg.with_content(RecordDict({"config": config})), context)
    metrics = MetricRecord({**reply.content["metrics"], "modded": 1})  # type: ignore[dict-item]
    return reply.with_content(RecordDict({"metrics": metrics}))


async def test_a_mod_changes_the_message_and_the_reply(
    run: Runner, kind: str, context: Context
) -> None:
    def body(msg: Message, context: Context) -> Message:
        return reply_with(msg, lr=msg.content["config"]["lr"])  # type: ignore[arg-type]

    reply = await run(app(kind, body, scale_lr), delivered(), context)

    assert reply.content["metrics"] == MetricRecord({"lr": 1.0, "modded": 1})


async def test_a_mod_may_answer_without_the_handler(run: Runner, context: Context) -> None:
    def short_circuit(msg: Message, context: Context, call_next: CallNext) -> Message:
        return Message(error=Error(0, "node busy"), reply_to=msg)

    def body(msg: Message, context: Context) -> Message:
        raise AssertionError("the handler must not run")

    reply = await run(app("def", body, short_circuit), delivered(), context)

    assert reply.error == Error(0, "node busy")


async def test_context_state_set_in_a_mod_reaches_the_handler(
    run: Runner, kind: str, context: Context
) -> None:
    def mark(msg: Message, context: Context, call_next: CallNext) -> Message:
        context.state["mod"] = MetricRecord({"seen": 1})
        return call_next(msg, context)

    def body(msg: Message, context: Context) -> Message:
        return reply_with(msg, seen=context.state["mod"]["seen"])  # type: ignore[arg-type]

    reply = await run(app(kind, body, mark), delivered(), context)

    assert reply.content["metrics"]["seen"] == 1


# ------------------------------------------------------------------ where the chain runs


def thread_of(where: dict[str, int]) -> Callable[[Message, Context, CallNext], Message]:
    def mod(msg: Message, context: Context, call_next: CallNext) -> Message:
        where["mod"] = threading.get_ident()
        return call_next(msg, context)

    return mod


@pytest.mark.parametrize(
    ("in_thread", "kind", "mod_on_loop", "handler_on_loop"),
    [
        (True, "def", False, False),  # as a plain handler: in a worker thread
        (False, "def", True, True),  # as a plain handler: on the loop's thread
        (True, "async def", False, True),  # mods in a thread, the handler on the loop
        (False, "async def", False, True),  # mods cannot wait for a coroutine on the loop
    ],
)
async def test_where_mods_and_handler_run(
    context: Context, in_thread: bool, kind: str, mod_on_loop: bool, handler_on_loop: bool
) -> None:
    loop_thread = threading.get_ident()
    where: dict[str, int] = {}

    def body(msg: Message, context: Context) -> Message:
        where["handler"] = threading.get_ident()
        return reply_with(msg, n=1)

    client = app(kind, body, thread_of(where))
    reply = await client.handle(delivered(), context, in_thread=in_thread)

    assert reply.has_content()
    assert (where["mod"] == loop_thread) is mod_on_loop
    assert (where["handler"] == loop_thread) is handler_on_loop


async def test_blocking_runs_mods_and_handler_on_the_calling_thread(
    kind: str, context: Context
) -> None:
    where: dict[str, int] = {}

    def body(msg: Message, context: Context) -> Message:
        where["handler"] = threading.get_ident()
        return reply_with(msg, n=1)

    client = app(kind, body, thread_of(where))

    def work() -> tuple[Message, int]:
        loop = asyncio.new_event_loop()
        try:
            return client.handle_blocking(delivered(), context, loop.run_until_complete), (
                threading.get_ident()
            )
        finally:
            loop.close()

    reply, worker = await anyio.to_thread.run_sync(work)

    assert reply.has_content()
    assert where == {"mod": worker, "handler": worker}


class PlainReturningCoroutine:
    """A plain callable whose result is a coroutine: not detectable as async up front."""

    def __call__(self, msg: Message, context: Context) -> Awaitable[Message]:
        async def answer() -> Message:
            return reply_with(msg, n=1)

        return answer()


@pytest.mark.parametrize("runner", [on_thread, blocking], ids=lambda r: r.__name__)
async def test_a_coroutine_from_a_plain_handler_is_finished_through_mods(
    runner: Runner, context: Context
) -> None:
    client = ClientApp(mods=[tracing("a", [])])
    client.train()(PlainReturningCoroutine())

    reply = await runner(client, delivered(), context)

    assert reply.content["metrics"] == MetricRecord({"n": 1})


async def test_on_the_loop_a_coroutine_from_a_plain_handler_is_an_error(
    context: Context,
) -> None:
    client = ClientApp(mods=[tracing("a", [])])
    client.train()(PlainReturningCoroutine())

    reply = await on_loop(client, delivered(), context)

    assert_error(reply, "TypeError", "declare the handler `async def`")


async def test_mods_do_not_see_unhandled_messages(run: Runner, context: Context) -> None:
    trace: list[str] = []
    client = app("def", answer, tracing("a", trace))

    reply = await run(client, delivered(message_type="query"), context)

    assert_error(reply, "no handler for 'query'")
    assert trace == []


# ------------------------------------------------------------------ failures


def raising(msg: Message, context: Context, call_next: CallNext) -> Message:
    raise LookupError("no key material")


def exiting(msg: Message, context: Context, call_next: CallNext) -> Message:
    sys.exit(4)


def returns_none(msg: Message, context: Context, call_next: CallNext) -> Message:
    call_next(msg, context)
    return None  # type: ignore[return-value]


def returns_a_stranger(msg: Message, context: Context, call_next: CallNext) -> Message:
    call_next(msg, context)
    return reply_with(delivered(message_id="other"), n=1)


@pytest.mark.parametrize(
    ("mod", "fragments"),
    [
        (raising, ("LookupError: no key material",)),
        (exiting, ("SystemExit: 4",)),
        (returns_none, ("mod returns_none returned NoneType", "reply_to=msg")),
        (returns_a_stranger, ("mod returns_a_stranger returned a Message that is not a reply",)),
    ],
    ids=["raises", "sys.exit", "non-message", "not-a-reply"],
)
async def test_a_failing_mod_costs_an_error_reply(
    run: Runner,
    kind: str,
    context: Context,
    mod: Callable[[Message, Context, CallNext], Message],
    fragments: tuple[str, ...],
) -> None:
    reply = await run(app(kind, answer, tracing("outer", []), mod), delivered(), context)

    assert_error(reply, *fragments)


async def test_a_handler_exception_passes_through_the_mods(
    run: Runner, kind: str, context: Context
) -> None:
    caught: list[BaseException] = []

    def catching(msg: Message, context: Context, call_next: CallNext) -> Message:
        try:
            return call_next(msg, context)
        except ZeroDivisionError as exc:
            caught.append(exc)
            raise

    def body(msg: Message, context: Context) -> Message:
        return reply_with(msg, x=1 / 0)

    reply = await run(app(kind, body, catching), delivered(), context)

    assert_error(reply, "ZeroDivisionError: division by zero")
    assert len(caught) == 1


async def test_a_mod_may_recover_from_a_handler_exception(
    run: Runner, kind: str, context: Context
) -> None:
    def recovering(msg: Message, context: Context, call_next: CallNext) -> Message:
        try:
            return call_next(msg, context)
        except ZeroDivisionError:
            return reply_with(msg, recovered=1)

    def body(msg: Message, context: Context) -> Message:
        return reply_with(msg, x=1 / 0)

    reply = await run(app(kind, body, recovering), delivered(), context)

    assert reply.content["metrics"] == MetricRecord({"recovered": 1})


async def test_call_next_turns_a_bad_handler_return_into_an_error_reply(
    run: Runner, kind: str, context: Context
) -> None:
    seen: list[Message] = []

    def observing(msg: Message, context: Context, call_next: CallNext) -> Message:
        reply = call_next(msg, context)
        seen.append(reply)
        return reply

    def body(msg: Message, context: Context) -> Message:
        return "done"  # type: ignore[return-value]

    reply = await run(app(kind, body, observing), delivered(), context)

    assert_error(reply, "the train handler returned str")
    assert seen == [reply]


async def test_a_failure_is_logged_as_handler_or_mod(
    caplog: pytest.LogCaptureFixture, context: Context
) -> None:
    caplog.set_level(logging.WARNING, "fedcore.apps.client_app")

    await on_thread(app("def", answer, raising), delivered(), context)

    assert "train handler or a mod raised on node 7" in caplog.records[0].getMessage()


# ------------------------------------------------------------------ validation


def two_arguments(msg: Message, context: Context) -> Message:
    return msg


async def async_mod(msg: Message, context: Context, call_next: CallNext) -> Message:
    return call_next(msg, context)


@pytest.mark.parametrize(
    ("mods", "match"),
    [
        (fixedclipping_mod, r"mods must be a list of mods, got function"),
        ("fixedclipping_mod", r"mods must be a list of mods, got str"),
        ([message_stats_mod, 3], r"mods\[1\] must be callable, got int"),
        ([two_arguments], r"mods\[0\] \(two_arguments\) must take \(msg, context, call_next\)"),
        ([async_mod], r"mods\[0\] \(async_mod\) is async; a mod is a plain def"),
    ],
)
def test_mods_are_checked_when_the_app_is_built(mods: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        ClientApp(mods=mods)


def test_mods_are_kept_in_order() -> None:
    assert ClientApp(mods=(message_stats_mod, fixedclipping_mod)).mods == [
        message_stats_mod,
        fixedclipping_mod,
    ]
    assert ClientApp().mods == []


# ------------------------------------------------------------------ fixedclipping_mod


def train_message(
    w: list[float],
    b: list[float],
    clipping_norm: float | None = 1.0,
    *,
    message_id: str = "m1",
    **extra: ArrayRecord,
) -> Message:
    config = ConfigRecord(
        {"lr": 0.1} if clipping_norm is None else {"clipping_norm": clipping_norm}
    )
    arrays = ArrayRecord({"w": np.array(w), "b": np.array(b, dtype=np.float32)})
    content = RecordDict({"arrays": arrays, "config": config, **extra})
    return delivered(content, message_id=message_id)


def moving_to(w: list[float], b: list[float]) -> Callable[[Message, Context], Message]:
    """A train body that answers with arrays ``w`` and ``b``."""

    def body(msg: Message, context: Context) -> Message:
        arrays = ArrayRecord({"w": np.array(w), "b": np.array(b, dtype=np.float32)})
        metrics = MetricRecord({"num-examples": 4})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return body


async def test_fixedclipping_mod_clips_a_long_update(
    run: Runner, kind: str, context: Context
) -> None:
    # sent w=[1, 1], b=[0]; reply w=[4, 5], b=[12]: update (3, 4, 12), norm 13.
    client = app(kind, moving_to([4.0, 5.0], [12.0]), fixedclipping_mod)

    reply = await run(client, train_message([1.0, 1.0], [0.0], clipping_norm=6.5), context)

    # scaled by 6.5 / 13 = 0.5: update (1.5, 2, 6)
    arrays = reply.content["arrays"]
    np.testing.assert_allclose(arrays["w"], [2.5, 3.0])
    np.testing.assert_allclose(arrays["b"], [6.0])
    assert arrays["b"].dtype == np.float32
    assert reply.content["metrics"] == MetricRecord({"num-examples": 4})


async def test_fixedclipping_mod_leaves_a_short_update_alone(context: Context) -> None:
    client = app("def", moving_to([4.0, 5.0], [12.0]), fixedclipping_mod)

    reply = await on_thread(client, train_message([1.0, 1.0], [0.0], clipping_norm=13.0), context)

    assert reply.content["arrays"] == ArrayRecord(
        {"w": np.array([4.0, 5.0]), "b": np.array([12.0], dtype=np.float32)}
    )


async def test_fixedclipping_mod_measures_from_the_arrays_before_the_handler(
    context: Context,
) -> None:
    """A handler that updates the received arrays in place still gets clipped."""

    def in_place(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        arrays["w"] += np.array([3.0, 4.0])
        metrics = MetricRecord({"num-examples": 1})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    client = app("def", in_place, fixedclipping_mod)

    reply = await on_loop(client, train_message([0.0, 0.0], [0.0], clipping_norm=1.0), context)

    np.testing.assert_allclose(reply.content["arrays"]["w"], [0.6, 0.8])


async def test_fixedclipping_mod_without_the_norm_is_an_error_naming_the_key(
    run: Runner, context: Context
) -> None:
    ran: list[bool] = []

    def body(msg: Message, context: Context) -> Message:
        ran.append(True)
        return reply_with(msg)

    client = app("def", body, fixedclipping_mod)

    reply = await run(client, train_message([1.0], [1.0], clipping_norm=None), context)

    assert_error(reply, "'clipping_norm'", "DifferentialPrivacyClientSideFixedClipping")
    assert ran == []


@pytest.mark.parametrize("norm", [0.0, -1.0, "1.0"])
async def test_fixedclipping_mod_refuses_a_bad_norm(norm: Any, context: Context) -> None:
    client = app("def", moving_to([1.0], [1.0]), fixedclipping_mod)
    message = train_message([1.0], [1.0], clipping_norm=None)
    message.content["config"]["clipping_norm"] = norm

    reply = await on_loop(client, message, context)

    assert_error(reply, "'clipping_norm' must be a number > 0")


async def test_fixedclipping_mod_needs_one_array_record(context: Context) -> None:
    client = app("def", moving_to([1.0], [1.0]), fixedclipping_mod)
    extra = ArrayRecord({"w": np.zeros(1)})

    reply = await on_loop(client, train_message([1.0], [1.0], extra=extra), context)

    assert_error(reply, "must carry one ArrayRecord, found 2")


async def test_fixedclipping_mod_passes_other_messages_and_error_replies(
    context: Context,
) -> None:
    client = ClientApp(mods=[fixedclipping_mod])
    client.evaluate()(answer)
    client.train()(lambda msg, context: Message(error=Error(0, "no data"), reply_to=msg))

    evaluated = await on_loop(client, delivered(message_type="evaluate"), context)
    trained = await on_loop(client, train_message([1.0], [1.0]), context)

    assert evaluated.has_content()
    assert trained.error == Error(0, "no data")


async def test_fixedclipping_mod_clips_train_actions_too(context: Context) -> None:
    client = ClientApp(mods=[fixedclipping_mod])
    client.train("fast")(moving_to([4.0, 5.0], [12.0]))
    message = train_message([1.0, 1.0], [0.0], clipping_norm=6.5)
    message.metadata.message_type = "train.fast"

    reply = await on_loop(client, message, context)

    np.testing.assert_allclose(reply.content["arrays"]["w"], [2.5, 3.0])


# ------------------------------------------------------------------ message_stats_mod


async def test_message_stats_mod_records_exact_encoded_sizes(
    run: Runner, kind: str, context: Context
) -> None:
    answered: list[Message] = []

    def body(msg: Message, context: Context) -> Message:
        reply = moving_to([4.0, 5.0, 6.0], [1.0])(msg, context)
        answered.append(reply)
        return reply

    message = train_message([1.0, 1.0, 1.0], [0.0])
    reply = await run(app(kind, body, message_stats_mod), message, context)

    metrics = reply.content["metrics"]
    assert metrics["incoming-message-bytes"] == len(pack_message(message))
    assert metrics["outgoing-message-bytes"] == len(pack_message(answered[0]))
    assert metrics["num-examples"] == 4
    assert list(reply.content) == ["arrays", "metrics"]


def test_encoded_size_is_the_length_of_the_packed_message() -> None:
    strided = ArrayRecord({"w": np.arange(12.0).reshape(3, 4)[:, ::2]})
    for message in (
        train_message([1.0], [2.0]),
        delivered(RecordDict({"arrays": strided})),
        Message(error=Error(2, "boom"), reply_to=delivered()),
    ):
        assert encoded_size(message) == len(pack_message(message))


async def test_message_stats_mod_times_the_handler(kind: str, context: Context) -> None:
    inside: list[float] = []

    def body(msg: Message, context: Context) -> Message:
        started = time.perf_counter()
        while time.perf_counter() - started < 0.02:  # busy, not asleep: no time.sleep in tests
            pass
        inside.append(time.perf_counter() - started)
        return reply_with(msg, n=1)

    client = app(kind, body, message_stats_mod)
    started = time.perf_counter()
    reply = await on_thread(client, delivered(), context)
    outside = time.perf_counter() - started

    seconds = reply.content["metrics"]["handler-seconds"]
    assert isinstance(seconds, float)
    assert inside[0] <= seconds <= outside


async def test_message_stats_mod_makes_a_metric_record_when_there_is_none(
    context: Context,
) -> None:
    def body(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"config": ConfigRecord({"x": "y"})}), reply_to=msg)

    reply = await on_loop(app("def", body, message_stats_mod), delivered(), context)

    assert list(reply.content) == ["config", "metrics"]
    assert set(reply.content["metrics"]) == {
        "incoming-message-bytes",
        "outgoing-message-bytes",
        "handler-seconds",
    }
    assert reply.content["metrics"]["handler-seconds"] >= 0  # type: ignore[operator]


async def test_message_stats_mod_does_not_change_the_handlers_record(context: Context) -> None:
    record = MetricRecord({"num-examples": 1})

    def body(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": record}), reply_to=msg)

    reply = await on_loop(app("def", body, message_stats_mod), delivered(), context)

    assert record == MetricRecord({"num-examples": 1})
    assert len(reply.content["metrics"]) == 4


async def test_message_stats_mod_passes_error_replies_untouched(context: Context) -> None:
    error = Error(0, "no data")

    def body(msg: Message, context: Context) -> Message:
        return Message(error=error, reply_to=msg)

    reply = await on_loop(app("def", body, message_stats_mod), delivered(), context)

    assert reply.error == error


async def test_fedavg_aggregates_replies_the_stats_mod_touched(context: Context) -> None:
    client = app("def", moving_to([3.0, 3.0, 3.0], [3.0]), message_stats_mod, fixedclipping_mod)
    replies = [
        await on_loop(client, train_message([1.0, 1.0, 1.0], [1.0], message_id=f"m{i}"), context)
        for i in range(2)
    ]

    arrays, metrics = FedAvg().aggregate_train(1, replies)

    assert arrays is not None
    assert metrics is not None
    assert math.isclose(
        metrics["outgoing-message-bytes"],  # type: ignore[arg-type]
        replies[0].content["metrics"]["outgoing-message-bytes"],  # type: ignore[arg-type]
    )
    # update (2, 2, 2, 2) of norm 4, clipped to 1: (0.5, 0.5, 0.5, 0.5)
    np.testing.assert_allclose(arrays["w"], [1.5, 1.5, 1.5])


# ------------------------------------------------------------------ a lifespan taking a Context


def test_the_mod_types_are_public_under_flowers_names_too() -> None:
    import fedcore.apps
    import fedcore.mods

    for module in (fedcore.apps, fedcore.mods):
        assert module.Mod is fedcore.apps.client_app.Mod
        assert module.CallNext is module.ClientAppCallable is CallNext


async def test_a_lifespan_taking_a_context_runs_around_each_message_outside_the_mods(
    run: Runner, kind: str, context: Context
) -> None:
    trace: list[str] = []

    def body(msg: Message, ctx: Context) -> Message:
        trace.append("handler")
        return answer(msg, ctx)

    client = app(kind, body, tracing("mod", trace))

    @client.lifespan()
    def lifespan(ctx: Context) -> Iterator[None]:
        trace.append(f"setup {ctx.node_id}")
        yield
        trace.append("teardown")

    for _ in range(2):
        assert (await run(client, delivered(), context)).has_content()
    once = [f"setup {NODE_ID}", "mod in", "handler", "mod out", "teardown"]
    assert trace == once + once
    with client.started():  # nothing once per worker: it runs per message instead
        assert trace == once + once


async def test_a_failing_context_lifespan_costs_that_messages_reply(
    run: Runner, kind: str, context: Context
) -> None:
    client = app(kind, answer)

    @client.lifespan()
    def lifespan(ctx: Context) -> Iterator[None]:
        raise OSError(f"no data for node {ctx.node_id}")
        yield

    assert_error(await run(client, delivered(), context), f"OSError: no data for node {NODE_ID}")


async def test_a_lifespan_without_arguments_still_runs_once_per_worker(
    run: Runner, context: Context
) -> None:
    trace: list[str] = []
    client = app("def", answer)

    @client.lifespan()
    def lifespan() -> Iterator[None]:
        trace.append("setup")
        yield
        trace.append("teardown")

    assert (await run(client, delivered(), context)).has_content()
    assert trace == []
    with client.started():
        assert trace == ["setup"]
    assert trace == ["setup", "teardown"]


def test_a_client_lifespan_takes_no_argument_or_the_context() -> None:
    client = ClientApp()

    def two(context: Context, extra: int) -> Iterator[None]:
        yield

    with pytest.raises(TypeError, match="no argument or one"):
        client.lifespan()(two)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator function"):
        client.lifespan()(lambda context: None)  # type: ignore[arg-type, return-value]
