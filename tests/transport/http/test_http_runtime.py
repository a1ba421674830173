"""The runtime API over HTTP on loopback: every route, the run's secret, waits, caps, garbage."""

from __future__ import annotations

import hmac
import math
import mmap
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import numpy as np
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain import Error, ErrorCode, Message, RecordDict, Run, RunStatus
from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord
from fedcore.errors import (
    ConflictError,
    DecodeError,
    FedcoreError,
    LinkUnavailableError,
    MessageNotFoundError,
    NotFoundError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.state.ledger import missing_artifact
from fedcore.testing import FakeClock
from fedcore.testing.arrays import backing
from fedcore.testing.network import closed_port
from fedcore.transport.http import HttpRuntimeClient, runtime_app, serve_http
from fedcore.transport.http.session import Body
from fedcore.transport.runtime import RuntimeService
from fedcore.wire import pack_message, pack_recorddict
from fedcore.wire.batch import pack_batch, unpack_batch

pytestmark = pytest.mark.anyio

RUN_ID = 2**62 + 99
SECRET = "launch-secret-1"
MiB = 1 << 20


class FakeRuntime(RuntimeService):
    """A RuntimeService in memory: records what reached it, waits on a fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.runs = {RUN_ID: Run(RUN_ID, {"rounds": 2}, RunStatus.RUNNING, seed=4)}
        self.secrets = {RUN_ID: SECRET}
        self.node_ids = [2**62 + 1]
        self.pushed: list[Message] = []
        self.replies: dict[str, Message] = {}
        self.contexts: dict[int, RecordDict] = {}
        self.logs: list[str] = []
        self.log_batches: list[str] = []
        self.metrics: list[dict[str, Any]] = []
        self.metrics_batches: list[str] = []
        self.artifacts: dict[str, RecordDict] = {}
        self.calls: list[tuple[str, Any]] = []
        """What reached the service past authentication, with the arguments that matter."""
        self.failure: Exception | None = None
        self.waiting = anyio.Event()
        """Set when a call starts waiting."""
        self.hold: anyio.Event | None = None
        """When set, get_node_ids waits for it before answering."""
        self._changed = anyio.Event()

    def changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _called(self, name: str, detail: Any = None) -> Run:
        self.calls.append((name, detail))
        if self.failure is not None:
            raise self.failure
        return self.runs[RUN_ID]

    async def _wait(self, seconds: float, ready: Callable[[], bool]) -> None:
        if seconds <= 0:
            return
        with self.clock.move_on_after(seconds):
            while not ready():
                changed = self._changed
                self.waiting.set()
                await changed.wait()

    async def authenticate(self, run_id: int, secret: str) -> Run:
        known = self.secrets.get(run_id)
        if known is None or not hmac.compare_digest(known, secret):
            raise RunNotFoundError(f"no run {run_id} (fake)")
        return self.runs[run_id]

    async def heartbeat(self, run_id: int, heartbeat_interval: float) -> Run:
        run = self._called("heartbeat", heartbeat_interval)
        if run.status.finished:
            raise RunFinishedError(f"run {run_id} has finished")
        return run

    async def get_node_ids(
        self, run_id: int, *, at_least: int = 0, wait_seconds: float = 0.0
    ) -> list[int]:
        self._called("get_node_ids", (at_least, wait_seconds))
        if self.hold is not None:
            self.waiting.set()
            await self.hold.wait()
        await self._wait(wait_seconds, lambda: len(self.node_ids) >= at_least)
        return list(self.node_ids)

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        self._called("push_messages", len(messages))
        ids = [f"msg-{len(self.pushed) + i}" for i in range(len(messages))]
        self.pushed.extend(messages)
        return ids

    async def pull_replies(
        self, run_id: int, message_ids: Sequence[str] | None, *, wait_seconds: float = 0.0
    ) -> list[Message]:
        asked = None if message_ids is None else list(message_ids)
        self._called("pull_replies", (asked, wait_seconds))

        def wanted() -> list[str]:
            return list(self.replies) if asked is None else asked

        await self._wait(wait_seconds, lambda: any(i in self.replies for i in wanted()))
        return [self.replies[i] for i in wanted() if i in self.replies]

    async def ack_replies(self, run_id: int, message_ids: Sequence[str]) -> None:
        self._called("ack_replies", list(message_ids))
        for message_id in message_ids:
            self.replies.pop(message_id, None)

    async def save_context(self, run_id: int, state: RecordDict) -> None:
        self._called("save_context")
        self.contexts[run_id] = state

    async def load_context(self, run_id: int) -> RecordDict:
        self._called("load_context")
        return self.contexts.get(run_id, RecordDict())

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> None:
        self._called("append_logs")
        self.logs.extend(lines)
        self.log_batches.append(batch)

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> None:
        self._called("append_metrics")
        self.metrics.extend(documents)
        self.metrics_batches.append(batch)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        self._called("put_artifact", name)
        self.artifacts[name] = content

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        self._called("get_artifact", name)
        if name not in self.artifacts:
            raise missing_artifact(run_id, name)
        return self.artifacts[name]

    async def finish(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        run = self._called("finish", (status, reason))
        if not run.status.finished:
            run.status, run.reason = status, reason
        return run


class BodySizes:
    """The declared length of each request body, noted by a middleware."""

    def __init__(self) -> None:
        self.sizes: list[int | None] = []

        @web.middleware
        async def note(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            self.sizes.append(request.content_length)
            return await handler(request)

        self.middleware = note


@asynccontextmanager
async def served(
    service: RuntimeService,
    *,
    secret: str = SECRET,
    client_options: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[HttpRuntimeClient, str, BodySizes]]:
    """A client of ``service`` over 127.0.0.1, the base URL, and the request sizes seen."""
    app = runtime_app(service, **options)
    sizes = BodySizes()
    app.middlewares.append(sizes.middleware)
    async with (
        serve_http(app, "127.0.0.1", 0, name="runtime") as port,
        HttpRuntimeClient("127.0.0.1", port, secret=secret, **(client_options or {})) as client,
    ):
        yield client, f"http://127.0.0.1:{port}", sizes


@pytest.fixture
def fake(fake_clock: FakeClock) -> FakeRuntime:
    return FakeRuntime(fake_clock)


def credentials(secret: str = SECRET, run_id: object = RUN_ID) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", "X-Fedcore-Run": str(run_id)}


def model(nbytes: int, fill: float = 0.0) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.full(nbytes // 4, fill, np.float32)})})


def to_node(node_id: int, content: RecordDict) -> Message:
    return Message(content, node_id, "train", group_id="round-1", ttl=600)


def reply_to(message: Message, message_id: str, content: RecordDict | None = None) -> Message:
    if content is None:
        reply = Message(error=Error(ErrorCode.NODE_UNAVAILABLE, "gone"), reply_to=message)
    else:
        reply = Message(content, reply_to=message)
    message.metadata.message_id = message_id
    reply.metadata.reply_to_message_id = message_id
    return reply


# ------------------------------------------------------------------- round trips


async def test_authenticate_heartbeat_and_finish(fake: FakeRuntime) -> None:
    async with served(fake) as (client, _, _):
        run = await client.authenticate(RUN_ID, SECRET)
        assert run.run_id == RUN_ID
        assert run.run_config == {"rounds": 2}
        assert run.seed == 4
        assert (await client.heartbeat(RUN_ID, 2.5)).status is RunStatus.RUNNING
        finished = await client.finish(RUN_ID, RunStatus.FAILED, "main raised: boom")
        assert (finished.status, finished.reason) == (RunStatus.FAILED, "main raised: boom")
        with pytest.raises(RunFinishedError, match="has finished"):
            await client.heartbeat(RUN_ID, 2.5)
    assert fake.calls[:2] == [
        ("heartbeat", 2.5),
        ("finish", (RunStatus.FAILED, "main raised: boom")),
    ]


async def test_node_ids_now_and_after_a_wait_that_nodes_end(fake: FakeRuntime) -> None:
    async with served(fake) as (client, _, _):
        assert await client.get_node_ids(RUN_ID) == [2**62 + 1]
        async with anyio.create_task_group() as tasks:
            found: list[int] = []

            async def wait() -> None:
                found.extend(await client.get_node_ids(RUN_ID, at_least=2, wait_seconds=60))

            tasks.start_soon(wait)
            with anyio.fail_after(5):
                await fake.waiting.wait()
                fake.node_ids.append(5)
                fake.changed()
        assert found == [2**62 + 1, 5]
    assert fake.calls[-1] == ("get_node_ids", (2, 60.0))


async def test_a_wait_the_service_ends_on_its_clock(fake: FakeRuntime) -> None:
    async with served(fake) as (client, _, _), anyio.create_task_group() as tasks:
        found: list[list[int]] = []

        async def wait() -> None:
            found.append(await client.get_node_ids(RUN_ID, at_least=9, wait_seconds=30))

        tasks.start_soon(wait)
        with anyio.fail_after(5):
            await fake.waiting.wait()
            fake.clock.advance(30)
    assert found == [[2**62 + 1]]


async def test_the_client_timeout_covers_the_wait_it_asks_for(fake: FakeRuntime) -> None:
    fake.hold = anyio.Event()
    async with served(fake, client_options={"timeout": 0.05}) as (client, _, _):
        async with anyio.create_task_group() as tasks:
            found: list[list[int]] = []

            async def wait() -> None:
                found.append(await client.get_node_ids(RUN_ID, wait_seconds=30))

            tasks.start_soon(wait)
            with anyio.fail_after(5):
                await fake.waiting.wait()
                await anyio.sleep(0.2)  # past the client's own timeout, within the wait
                fake.hold.set()
        assert found == [[2**62 + 1]]

        fake.hold = anyio.Event()
        with pytest.raises(LinkUnavailableError, match="Timeout"):
            await client.get_node_ids(RUN_ID)  # no wait asked: the service is too slow


async def test_a_shared_model_crosses_once_and_arrives_shared(fake: FakeRuntime) -> None:
    shared = model(MiB, 0.5)
    messages = [to_node(node_id, shared) for node_id in range(1, 51)]
    async with served(fake) as (client, _, sizes):
        ids = await client.push_messages(RUN_ID, messages)
    assert ids == [f"msg-{i}" for i in range(50)]
    assert sizes.sizes[-1] is not None
    assert MiB < sizes.sizes[-1] < MiB + 50 * 200
    assert all(message.content is fake.pushed[0].content for message in fake.pushed)
    assert [message.metadata.dst_node_id for message in fake.pushed] == list(range(1, 51))
    assert float(fake.pushed[0].content["arrays"]["w"][0]) == 0.5


async def test_large_payloads_are_spooled_on_arrival_both_ways(fake: FakeRuntime) -> None:
    """Past SPOOL_THRESHOLD a received model is a mapping of a spool file, not memory."""
    large, small = model(3 * MiB + 12, 0.25), model(64, 0.5)
    sent = [to_node(1, large), to_node(2, small)]
    async with served(fake) as (client, _, _):
        await client.push_messages(RUN_ID, sent)
        assert isinstance(backing(fake.pushed[0].content["arrays"]["w"]), mmap.mmap)
        fake.replies["m1"] = reply_to(sent[0], "m1", model(3 * MiB, 0.75))
        (reply,) = await client.pull_replies(RUN_ID, ["m1"])
        await client.save_context(RUN_ID, large)
        context = await client.load_context(RUN_ID)
        await client.push_messages(RUN_ID, [to_node(3, small)])
    assert fake.pushed[0].content == large
    assert isinstance(backing(reply.content["arrays"]["w"]), mmap.mmap)
    assert reply.content == model(3 * MiB, 0.75)
    assert context == large
    assert isinstance(backing(context["arrays"]["w"]), mmap.mmap)
    assert isinstance(backing(fake.contexts[RUN_ID]["arrays"]["w"]), mmap.mmap)
    assert not isinstance(backing(fake.pushed[-1].content["arrays"]["w"]), mmap.mmap)


async def test_a_push_over_the_body_cap_is_split(fake: FakeRuntime) -> None:
    messages = [to_node(node_id, model(100_000, node_id)) for node_id in range(1, 6)]
    options = {"max_body_bytes": 250_000}
    async with served(fake, client_options=options) as (client, _, sizes):
        ids = await client.push_messages(RUN_ID, messages)
    assert ids == [f"msg-{i}" for i in range(5)]
    assert [call for call in fake.calls if call[0] == "push_messages"] == [
        ("push_messages", 2),
        ("push_messages", 2),
        ("push_messages", 1),
    ]
    assert all(size is not None and size <= 250_000 for size in sizes.sizes)
    assert [float(m.content["arrays"]["w"][0]) for m in fake.pushed] == [1, 2, 3, 4, 5]


async def test_replies_are_pulled_kept_until_acked_and_split_by_the_cap(fake: FakeRuntime) -> None:
    sent = [to_node(node_id, model(16)) for node_id in range(1, 6)]
    for i, message in enumerate(sent):
        content = None if i == 0 else model(100_000, i)
        fake.replies[f"m{i}"] = reply_to(message, f"m{i}", content)
    ids = [f"m{i}" for i in range(5)]
    async with served(fake, max_body_bytes=250_000) as (client, _, _):
        first = await client.pull_replies(RUN_ID, ids)
        assert [r.metadata.reply_to_message_id for r in first] == ["m0", "m1", "m2"]
        assert first[0].has_error()
        assert first[0].error.code == ErrorCode.NODE_UNAVAILABLE
        assert pack_message(first[1]) == pack_message(fake.replies["m1"])
        again = await client.pull_replies(RUN_ID, ids)  # nothing acked: the same come again
        assert [r.metadata.reply_to_message_id for r in again] == ["m0", "m1", "m2"]
        await client.ack_replies(RUN_ID, ["m0", "m1", "m2"])
        rest = await client.pull_replies(RUN_ID, ids)
        assert [r.metadata.reply_to_message_id for r in rest] == ["m3", "m4"]
        await client.ack_replies(RUN_ID, ["m3", "m4"])
        assert await client.pull_replies(RUN_ID, ids) == []
    assert ("ack_replies", ["m0", "m1", "m2"]) in fake.calls


async def test_a_pull_without_ids_travels_as_null_and_takes_every_reply(
    fake: FakeRuntime,
) -> None:
    """``None`` (a Grid's pull without ids) is ``null`` on the wire, not ``[]``, which
    asks for nothing; a request that leaves the key out is still refused (below)."""
    sent = [to_node(node_id, model(16)) for node_id in (1, 2)]
    for i, message in enumerate(sent):
        fake.replies[f"m{i}"] = reply_to(message, f"m{i}", model(16, i))
    async with served(fake) as (client, _, _):
        every = await client.pull_replies(RUN_ID, None)
        assert await client.pull_replies(RUN_ID, []) == []
    assert [r.metadata.reply_to_message_id for r in every] == ["m0", "m1"]
    assert [call for call in fake.calls if call[0] == "pull_replies"] == [
        ("pull_replies", (None, 0.0)),
        ("pull_replies", ([], 0.0)),
    ]


async def test_a_pull_waits_for_a_first_reply(fake: FakeRuntime) -> None:
    message = to_node(1, model(16))
    async with served(fake) as (client, _, _), anyio.create_task_group() as tasks:
        got: list[Message] = []

        async def pull() -> None:
            got.extend(await client.pull_replies(RUN_ID, ["m1"], wait_seconds=60))

        tasks.start_soon(pull)
        with anyio.fail_after(5):
            await fake.waiting.wait()
            fake.replies["m1"] = reply_to(message, "m1", RecordDict({"c": ConfigRecord({"x": 1})}))
            fake.changed()
    assert [reply.content["c"]["x"] for reply in got] == [1]
    assert fake.calls[-1] == ("pull_replies", (["m1"], 60.0))


async def test_context_and_logs(fake: FakeRuntime) -> None:
    metrics = MetricRecord({"acc": [0.5, 0.75]})
    state = RecordDict({"model": model(64, 2.0)["arrays"], "metrics": metrics})
    async with served(fake) as (client, _, _):
        assert await client.load_context(RUN_ID) == RecordDict()
        await client.save_context(RUN_ID, state)
        assert fake.contexts[RUN_ID] == state
        assert await client.load_context(RUN_ID) == state
        await client.append_logs(RUN_ID, ["round 1", "ünïcode", ""])
        await client.append_logs(RUN_ID, ["named"], batch="b-1")
    assert fake.logs == ["round 1", "ünïcode", "", "named"]
    assert fake.log_batches == ["", "b-1"]


async def test_metrics_and_artifacts(fake: FakeRuntime) -> None:
    header = {"run": RUN_ID, "seed": 4, "config": {"rounds": 2}, "app": "ünï"}
    row = {"round": 1, "num_rounds": 2, "server": {"loss": math.nan, "acc": 0.5}}
    final = RecordDict({"arrays": model(1 << 20, 2.0)["arrays"]})
    async with served(fake) as (client, _, _):
        await client.append_metrics(RUN_ID, [header])
        await client.append_metrics(RUN_ID, [row], batch="b-2")
        with pytest.raises(NotFoundError, match="keeps no model"):
            await client.get_artifact(RUN_ID, "model")
        await client.put_artifact(RUN_ID, "model", final)
        assert await client.get_artifact(RUN_ID, "model") == final
    assert fake.metrics[0] == header
    assert fake.metrics[1]["round"] == 1
    assert math.isnan(fake.metrics[1]["server"]["loss"])
    assert fake.metrics_batches == ["", "b-2"]
    assert fake.artifacts == {"model": final}


# ------------------------------------------------------------------- the run's secret

ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/runtime/run", None),
    ("POST", "/v1/runtime/heartbeat", {"heartbeat_interval": 1.0}),
    ("GET", "/v1/runtime/nodes", None),
    ("POST", "/v1/runtime/messages", Body(pack_batch([to_node(1, model(16))]), "x")),
    ("POST", "/v1/runtime/replies/pull", {"message_ids": ["a"], "wait_seconds": 0}),
    ("POST", "/v1/runtime/replies/ack", {"message_ids": ["a"]}),
    ("GET", "/v1/runtime/context", None),
    ("PUT", "/v1/runtime/context", Body(pack_recorddict(RecordDict()), "x")),
    ("POST", "/v1/runtime/logs", {"lines": ["x"]}),
    ("POST", "/v1/runtime/metrics", {"documents": [{"round": 1}]}),
    ("PUT", "/v1/runtime/artifacts/model", Body(pack_recorddict(RecordDict()), "x")),
    ("GET", "/v1/runtime/artifacts/model", None),
    ("POST", "/v1/runtime/finish", {"status": "finished:completed", "reason": ""}),
]


async def test_a_wrong_secret_looks_exactly_like_an_unknown_run(fake: FakeRuntime) -> None:
    fake.runs[7] = Run(7)
    fake.secrets[7] = "another-secret"
    refused = [
        credentials("wrong"),
        credentials(run_id=RUN_ID + 1),
        credentials("another-secret"),  # another run's secret
        credentials(SECRET, run_id=7),  # this secret for another run
        credentials(run_id="x"),
        {"X-Fedcore-Run": str(RUN_ID)},
        {"Authorization": f"Bearer {SECRET}"},
        {"Authorization": SECRET, "X-Fedcore-Run": str(RUN_ID)},
        {},
    ]
    async with served(fake) as (_, url, _), aiohttp.ClientSession() as session:
        answers = set()
        for headers in refused:
            for method, path, body in ROUTES:
                kind = {"json": body} if isinstance(body, dict) else {"data": body}
                async with session.request(method, url + path, headers=headers, **kind) as answer:
                    answers.add((answer.status, await answer.read()))
        assert len(answers) == 1
        ((status, text),) = answers
        assert status == 404
        assert b'"error":"RunNotFoundError"' in text
        assert SECRET.encode() not in text
        assert b"fake" not in text  # the service's own wording is not passed on
    assert fake.calls == []


async def test_the_client_presents_the_secret_it_was_given(fake: FakeRuntime) -> None:
    async with served(fake, secret="wrong") as (client, _, _):
        with pytest.raises(RunNotFoundError):
            await client.heartbeat(RUN_ID, 1.0)
        with pytest.raises(RunNotFoundError):
            await client.push_messages(RUN_ID, [to_node(1, model(16))])
        assert (await client.authenticate(RUN_ID, SECRET)).run_id == RUN_ID
        with pytest.raises(RunNotFoundError):
            await client.authenticate(RUN_ID, "wrong")
    assert fake.calls == []


# ------------------------------------------------------------------- errors both ways


@pytest.mark.parametrize(
    ("raised", "status", "expected"),
    [
        (RunFinishedError("run finished"), 409, RunFinishedError),
        (ConflictError("other content"), 409, ConflictError),
        (MessageNotFoundError("no message m"), 404, MessageNotFoundError),
        (DecodeError("bad reply"), 400, DecodeError),
        (ValueError("negative interval"), 400, DecodeError),
        (LinkUnavailableError("closing"), 503, LinkUnavailableError),
        (OSError("/var/lib/secret"), 500, FedcoreError),
    ],
    ids=lambda v: repr(v)[:30],
)
async def test_service_errors_come_back_as_the_same_class(
    fake: FakeRuntime, raised: Exception, status: int, expected: type[Exception]
) -> None:
    fake.failure = raised
    async with served(fake) as (client, url, _), aiohttp.ClientSession() as session:
        with pytest.raises(expected) as caught:
            await client.push_messages(RUN_ID, [to_node(1, model(16))])
        assert type(caught.value) is expected
        assert "secret" not in str(caught.value)
        headers = credentials()
        async with session.get(f"{url}/v1/runtime/context", headers=headers) as answer:
            assert answer.status == status
        fake.failure = None
        assert await client.load_context(RUN_ID) == RecordDict()


async def test_nothing_listening_is_link_unavailable() -> None:
    port = closed_port()
    async with HttpRuntimeClient("127.0.0.1", port, secret=SECRET) as client:
        with pytest.raises(LinkUnavailableError, match=f"127.0.0.1:{port}"):
            await client.authenticate(RUN_ID, SECRET)
        with pytest.raises(LinkUnavailableError):
            await client.push_messages(RUN_ID, [to_node(1, model(16))])
        with pytest.raises(LinkUnavailableError):
            await client.pull_replies(RUN_ID, ["m"], wait_seconds=1)


async def test_an_answer_over_the_client_cap_is_refused(fake: FakeRuntime) -> None:
    fake.contexts[RUN_ID] = model(100_000)
    async with served(fake, client_options={"max_body_bytes": 50_000}) as (client, _, _):
        with pytest.raises(DecodeError, match="over the cap of 50000"):
            await client.load_context(RUN_ID)


# ------------------------------------------------------------------- caps and garbage


def long_values(nbytes: int) -> RecordDict:
    """A ConfigRecord with one ``nbytes``-long bytes value (over 1 MiB: after the header)."""
    return RecordDict({"config": ConfigRecord({"model": b"m" * nbytes})})


async def test_values_over_the_links_cap_are_refused_and_those_under_it_kept(
    fake: FakeRuntime,
) -> None:
    cap = 2 << 20
    async with served(fake, max_value_len=cap) as (client, _, _):
        await client.push_messages(RUN_ID, [to_node(1, long_values(cap))])
        assert fake.pushed[-1].content["config"]["model"] == b"m" * cap
        over = f"'model' of {cap + 1} bytes is over the cap of {cap}"
        with pytest.raises(DecodeError, match=over):
            await client.push_messages(RUN_ID, [to_node(1, long_values(cap + 1))])
        with pytest.raises(DecodeError, match=over):
            await client.save_context(RUN_ID, long_values(cap + 1))
        with pytest.raises(DecodeError, match=over):
            await client.put_artifact(RUN_ID, "model", long_values(cap + 1))
    assert len(fake.pushed) == 1


async def test_the_serverapps_client_decodes_within_its_cap(fake: FakeRuntime) -> None:
    cap = 2 << 20
    fake.contexts[RUN_ID] = long_values(cap + 1)
    async with served(fake, client_options={"max_value_len": cap}) as (client, _, _):
        with pytest.raises(DecodeError, match=f"over the cap of {cap}"):
            await client.load_context(RUN_ID)
    async with served(fake, client_options={"max_value_len": cap + 1}) as (client, _, _):
        assert (await client.load_context(RUN_ID))["config"]["model"] == b"m" * (cap + 1)


async def test_a_body_over_the_cap_is_refused_before_it_is_read(fake: FakeRuntime) -> None:
    async with served(fake, max_body_bytes=10_000) as (client, url, _):
        with pytest.raises(DecodeError, match="over the cap of 10000"):
            await client.save_context(RUN_ID, model(100_000))
        port = int(url.rsplit(":", 1)[1])
        request = (
            b"POST /v1/runtime/messages HTTP/1.1\r\nHost: link\r\n"
            + f"Authorization: Bearer {SECRET}\r\nX-Fedcore-Run: {RUN_ID}\r\n".encode()
            + b"Content-Length: 1000000000\r\n\r\n"
            + bytes(100)
        )
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request)
                answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 413")

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield bytes(5000)

        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/runtime/messages", data=chunks(), headers=credentials()) as r,
        ):
            assert r.status == 413
        assert fake.calls == []
        assert await client.load_context(RUN_ID) == RecordDict()


PAYLOAD_GARBAGE = [
    ("/v1/runtime/messages", "PUT", b"not a payload", 405),
    ("/v1/runtime/messages", "POST", b"not a payload", 400),
    ("/v1/runtime/messages", "POST", pack_recorddict(RecordDict()), 400),
    ("/v1/runtime/context", "PUT", pack_batch([]), 400),
    ("/v1/runtime/context", "PUT", b"FC", 400),
    ("/v1/runtime/heartbeat", "POST", b"{", 400),
    ("/v1/runtime/heartbeat", "POST", b'{"heartbeat_interval": "1"}', 400),
    ("/v1/runtime/heartbeat", "POST", b'{"heartbeat_interval": NaN}', 400),
    ("/v1/runtime/heartbeat", "POST", b"[]", 400),
    ("/v1/runtime/heartbeat", "POST", b"\xff\xfe", 400),
    ("/v1/runtime/replies/pull", "POST", b'{"message_ids": [1], "wait_seconds": 0}', 400),
    ("/v1/runtime/replies/pull", "POST", b'{"message_ids": [], "wait_seconds": -1}', 400),
    ("/v1/runtime/replies/pull", "POST", b'{"wait_seconds": 0}', 400),
    ("/v1/runtime/replies/ack", "POST", b'{"message_ids": "m"}', 400),
    ("/v1/runtime/logs", "POST", b'{"lines": [null]}', 400),
    ("/v1/runtime/logs", "POST", b'{"lines": [], "batch": 7}', 400),
    ("/v1/runtime/metrics", "POST", b'{"documents": {"round": 1}}', 400),
    ("/v1/runtime/metrics", "POST", b'{"documents": [[1]]}', 400),
    ("/v1/runtime/metrics", "POST", b'{"documents": [], "batch": 7}', 400),
    ("/v1/runtime/artifacts/model", "PUT", b"not a payload", 400),
    ("/v1/runtime/artifacts/model", "PUT", pack_batch([]), 400),
    ("/v1/runtime/artifacts/model", "POST", pack_recorddict(RecordDict()), 405),
    ("/v1/runtime/finish", "POST", b'{"status": "done", "reason": ""}', 400),
    ("/v1/runtime/finish", "POST", b'{"status": "finished:failed"}', 400),
    ("/v1/runtime/finish", "POST", b"[" * 100_000, 400),
]


@pytest.mark.parametrize(("path", "method", "body", "status"), PAYLOAD_GARBAGE)
async def test_garbage_bodies_are_refused_cleanly(
    fake: FakeRuntime, path: str, method: str, body: bytes, status: int
) -> None:
    async with (
        served(fake) as (client, url, _),
        aiohttp.ClientSession() as session,
        session.request(method, url + path, data=body, headers=credentials()) as answer,
    ):
        assert answer.status == status
        if status == 400:
            assert (await answer.json())["error"] == "DecodeError"
        assert [name for name, _ in fake.calls] == []
        assert await client.get_node_ids(RUN_ID)


@pytest.mark.parametrize(
    "query",
    ["at_least=-1", "at_least=x", "wait_seconds=-1", "wait_seconds=inf", "wait_seconds=nan"],
)
async def test_bad_wait_queries_are_400(fake: FakeRuntime, query: str) -> None:
    async with (
        served(fake) as (_, url, _),
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/runtime/nodes?{query}", headers=credentials()) as answer,
    ):
        assert answer.status == 400
    assert fake.calls == []


async def test_a_compressed_body_is_refused(fake: FakeRuntime) -> None:
    headers = {**credentials(), "Content-Encoding": "gzip"}
    async with (
        served(fake) as (_, url, _),
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/runtime/messages", data=b"x", headers=headers) as answer,
    ):
        assert answer.status == 400
        assert "compressed" in (await answer.json())["message"]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=200))
async def test_random_bodies_on_every_route_are_never_a_500(fake: FakeRuntime, body: bytes) -> None:
    async with served(fake) as (_, url, _), aiohttp.ClientSession() as session:
        for method, path, _ in ROUTES:
            for data in (body, b"FC" + body, b"FCB\x01" + body):
                async with session.request(
                    method, url + path, data=data, headers=credentials()
                ) as answer:
                    assert answer.status < 500, (path, await answer.text())


async def test_a_pulled_batch_is_what_the_route_answers(fake: FakeRuntime) -> None:
    message = to_node(1, model(16))
    fake.replies["m1"] = reply_to(message, "m1", model(32, 3.0))
    request = {"message_ids": ["m1"], "wait_seconds": 0}
    async with (
        served(fake) as (_, url, _),
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/runtime/replies/pull", json=request, headers=credentials()) as r,
    ):
        assert r.headers["Content-Type"] == "application/vnd.fedcore.batch"
        (reply,) = unpack_batch(await r.read())
    assert pack_message(reply) == pack_message(fake.replies["m1"])
