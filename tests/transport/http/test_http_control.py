"""The control API over HTTP on loopback: every route, errors both ways, tokens, caps, garbage."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import numpy as np
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcore.domain import (
    ArrayRecord,
    LogLine,
    MetricsLine,
    RecordDict,
    Run,
    RunStatus,
    UserConfigValue,
)
from fedcore.errors import (
    AuthenticationError,
    BundleError,
    ClaimLostError,
    ConflictError,
    DecodeError,
    FedcoreError,
    InvalidTransitionError,
    LinkUnavailableError,
    MessageNotFoundError,
    NodeNotFoundError,
    NotFoundError,
    ReplyRejectedError,
    RunConfigError,
    RunFinishedError,
    RunNotFoundError,
    StateError,
    UsageError,
    WrongServiceError,
)
from fedcore.testing.network import closed_port
from fedcore.transport.control import ControlService, Health, NodeInfo
from fedcore.transport.http import HttpControlClient, control_app, page, serve_http
from fedcore.transport.http.session import Body

pytestmark = pytest.mark.anyio

BIG_ID = 2**62 + 12345  # well past 2^53: a double would round it
TOKEN = "s3cret-token"
ZIP = b"PK\x03\x04" + bytes(range(256)) * 4


class FakeControl(ControlService):
    """A ControlService in memory that records what reached it and fails on demand."""

    def __init__(self) -> None:
        self.runs: dict[int, Run] = {}
        self.bundles: dict[int, bytes] = {}
        self.lines: dict[int, list[LogLine]] = {}
        self.metrics_lines: dict[int, list[MetricsLine]] = {}
        self.artifacts: dict[tuple[int, str], RecordDict] = {}
        self.nodes = [NodeInfo(BIG_ID + 1, True), NodeInfo(3, True)]
        self.keys: list[str] = []
        self.failure: Exception | None = None
        """Raised by every call while set."""
        self.stream_failure: Exception | None = None
        """Raised by ``logs`` after the lines stored so far."""
        self._changed = anyio.Event()

    def add_run(self, status: RunStatus = RunStatus.RUNNING, **config: UserConfigValue) -> Run:
        run = Run(BIG_ID + len(self.runs), dict(config), status, seed=-(2**60), created_at=2.5)
        run.bundle_hash = "ab" * 32
        self.runs[run.run_id] = run
        self.lines[run.run_id] = []
        self.metrics_lines[run.run_id] = []
        return run

    def report(self, run_id: int, document: dict[str, Any]) -> None:
        lines = self.metrics_lines[run_id]
        lines.append(MetricsLine(len(lines) + 1, document))
        self._notify()

    def append(self, run_id: int, text: str) -> None:
        lines = self.lines[run_id]
        lines.append(LogLine(len(lines) + 1, 10.0 + len(lines), text))
        self._notify()

    def finish(self, run_id: int, status: RunStatus = RunStatus.COMPLETED) -> None:
        self.runs[run_id].status = status
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _run(self, run_id: int) -> Run:
        self._check()
        if run_id not in self.runs:
            raise RunNotFoundError(f"no run {run_id}")
        return self.runs[run_id]

    async def submit_run(self, bundle: bytes, run_config: Mapping[str, UserConfigValue]) -> Run:
        self._check()
        if not bundle.startswith(b"PK"):
            raise BundleError("the bundle is not a zip archive")
        run = self.add_run(RunStatus.PENDING, **run_config)
        self.bundles[run.run_id] = bundle
        return run

    async def list_runs(self) -> list[Run]:
        self._check()
        return list(self.runs.values())

    async def get_run(self, run_id: int) -> Run:
        return self._run(run_id)

    async def stop_run(self, run_id: int) -> Run:
        run = self._run(run_id)
        if not run.status.finished:
            self.finish(run_id, RunStatus.STOPPED)
        return run

    async def logs(
        self, run_id: int, *, after: int = 0, follow: bool = False
    ) -> AsyncIterator[LogLine]:
        self._run(run_id)
        seen = after
        while True:
            changed = self._changed
            fresh = [line for line in self.lines[run_id] if line.seq > seen]
            for line in fresh:
                yield line
            if fresh:
                seen = fresh[-1].seq
                continue
            if self.stream_failure is not None:
                raise self.stream_failure
            if not follow or self.runs[run_id].status.finished:
                return
            await changed.wait()

    async def metrics(
        self, run_id: int, *, after: int = 0, follow: bool = False
    ) -> AsyncIterator[MetricsLine]:
        self._run(run_id)
        seen = after
        while True:
            changed = self._changed
            fresh = [line for line in self.metrics_lines[run_id] if line.seq > seen]
            for line in fresh:
                yield line
            if fresh:
                seen = fresh[-1].seq
                continue
            if not follow or self.runs[run_id].status.finished:
                return
            await changed.wait()

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        self._run(run_id)
        try:
            return self.artifacts[run_id, name]
        except KeyError:
            raise NotFoundError(f"run {run_id} keeps no {name}") from None

    async def list_nodes(self) -> list[NodeInfo]:
        self._check()
        return self.nodes

    async def authorized_nodes(self) -> list[str]:
        self._check()
        return list(self.keys)

    async def authorize_node(self, public_key: str) -> list[str]:
        self._check()
        self.keys.append(public_key)
        return list(self.keys)

    async def deauthorize_node(self, public_key: str) -> list[str]:
        self._check()
        self.keys.remove(public_key)
        return list(self.keys)

    async def health(self) -> Health:
        self._check()
        return Health("9.9.9", runs_active=2, nodes_online=len(self.nodes))


@asynccontextmanager
async def served(
    service: ControlService, *, client_token: str | None = None, **options: Any
) -> AsyncIterator[tuple[HttpControlClient, str]]:
    """A client of ``service`` served on 127.0.0.1, and the server's base URL."""
    async with (
        serve_http(control_app(service, **options), "127.0.0.1", 0, name="control") as port,
        HttpControlClient("127.0.0.1", port, token=client_token) as client,
    ):
        yield client, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def raw() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def multipart(*parts: tuple[str, bytes, str]) -> aiohttp.MultipartWriter:
    with aiohttp.MultipartWriter("form-data") as body:
        for name, data, content_type in parts:
            part = body.append_payload(Body(data, content_type))
            part.set_content_disposition("form-data", name=name)
    return body


# ------------------------------------------------------------------- round trips


async def test_a_submitted_run_keeps_its_config_and_bundle_exactly() -> None:
    fake = FakeControl()
    config: dict[str, UserConfigValue] = {"rounds": 3, "lr": 0.25, "big": 2**63 - 1, "on": True}
    config["name"] = "ünï"
    async with served(fake) as (client, _):
        run = await client.submit_run(ZIP, config)
    assert run.run_id == BIG_ID
    assert run.status is RunStatus.PENDING
    assert run.run_config == config
    assert {key: type(value) for key, value in run.run_config.items()} == {
        key: type(value) for key, value in config.items()
    }
    assert fake.bundles[run.run_id] == ZIP
    assert fake.runs[run.run_id].run_config == config


async def test_runs_are_listed_shown_and_stopped() -> None:
    fake = FakeControl()
    first, second = fake.add_run(rounds=1), fake.add_run(RunStatus.COMPLETED)
    async with served(fake) as (client, _):
        assert await client.list_runs() == [first, second]
        shown = await client.get_run(first.run_id)
        assert shown == first
        assert shown.seed == -(2**60)
        assert shown.bundle_hash == "ab" * 32
        stopped = await client.stop_run(first.run_id)
        assert stopped.status is RunStatus.STOPPED
        assert (await client.stop_run(second.run_id)).status is RunStatus.COMPLETED


async def test_nodes_and_health() -> None:
    fake = FakeControl()
    async with served(fake) as (client, _):
        assert await client.list_nodes() == fake.nodes
        assert await client.health() == Health("9.9.9", 2, 2)


async def test_ids_travel_as_strings_and_a_submission_has_a_location() -> None:
    fake = FakeControl()
    run = fake.add_run()
    async with served(fake) as (_, url), raw() as session:
        async with session.get(f"{url}/v1/runs/{run.run_id}") as response:
            document = await response.json()
        assert document["run_id"] == str(BIG_ID)
        async with session.get(f"{url}/v1/nodes") as response:
            assert (await response.json())["nodes"][0]["node_id"] == str(BIG_ID + 1)
        body = multipart(("config", b"{}", "application/json"), ("bundle", ZIP, "application/zip"))
        async with session.post(f"{url}/v1/runs", data=body) as response:
            assert response.status == 201
            created = await response.json()
            assert response.headers["Location"] == f"/v1/runs/{created['run_id']}"


async def test_logs_after_a_line_without_following() -> None:
    fake = FakeControl()
    run = fake.add_run()
    for text in ("one", "two", "three"):
        fake.append(run.run_id, text)
    async with served(fake) as (client, _):
        lines = [line async for line in client.logs(run.run_id)]
        assert [line.text for line in lines] == ["one", "two", "three"]
        assert lines[1] == LogLine(2, 11.0, "two")
        assert [line.seq async for line in client.logs(run.run_id, after=2)] == [3]
        assert [line async for line in client.logs(run.run_id, after=3)] == []


async def test_following_logs_streams_lines_as_they_come_and_ends_with_the_run() -> None:
    fake = FakeControl()
    run = fake.add_run()
    fake.append(run.run_id, "one")
    send, receive = anyio.create_memory_object_stream[LogLine](10)
    async with served(fake) as (client, _), receive, anyio.create_task_group() as tasks:

        async def follow() -> None:
            async with send:
                async for line in client.logs(run.run_id, follow=True):
                    await send.send(line)

        tasks.start_soon(follow)
        with anyio.fail_after(5):
            assert (await receive.receive()).text == "one"
            fake.append(run.run_id, "two")
            assert (await receive.receive()).text == "two"
            fake.append(run.run_id, "three")
            fake.finish(run.run_id)
            assert [line.text async for line in receive] == ["three"]


async def test_logs_of_an_unknown_run_fail_on_the_first_step() -> None:
    async with served(FakeControl()) as (client, _):
        lines = client.logs(5, follow=True)
        with pytest.raises(RunNotFoundError, match="no run 5"):
            await anext(lines)


async def test_a_stream_that_fails_midway_raises_the_error_after_the_lines() -> None:
    fake = FakeControl()
    run = fake.add_run()
    fake.append(run.run_id, "one")
    fake.stream_failure = RunNotFoundError("the run was deleted")
    seen: list[str] = []
    async with served(fake) as (client, _):

        async def read_all() -> None:
            async for line in client.logs(run.run_id):
                seen.append(line.text)

        with pytest.raises(RunNotFoundError, match="deleted"):
            await read_all()
        assert seen == ["one"]

        fake.stream_failure = KeyError("/srv/secret/path")
        with pytest.raises(FedcoreError, match="internal error") as caught:
            await read_all()
        assert type(caught.value) is FedcoreError
        assert "secret" not in str(caught.value)


# ------------------------------------------------------------------- errors both ways

MAPPED = [
    (RunNotFoundError("no run 7"), 404, RunNotFoundError),
    (NodeNotFoundError("no node"), 404, NodeNotFoundError),
    (MessageNotFoundError("no message"), 404, MessageNotFoundError),
    (NotFoundError("nothing"), 404, NotFoundError),
    (ConflictError("same id"), 409, ConflictError),
    (RunFinishedError("finished"), 409, RunFinishedError),
    (InvalidTransitionError("no move"), 409, InvalidTransitionError),
    (ClaimLostError("stale"), 409, ClaimLostError),
    (ReplyRejectedError("expired"), 409, ReplyRejectedError),
    (StateError("refused"), 409, StateError),
    (BundleError("bad zip"), 400, BundleError),
    (RunConfigError("bad key"), 400, RunConfigError),
    (UsageError("bad flag"), 400, UsageError),
    (DecodeError("bad bytes"), 400, DecodeError),
    (ValueError("bad value\nsecond line"), 400, DecodeError),
    (LinkUnavailableError("shutting down"), 503, LinkUnavailableError),
]


@pytest.mark.parametrize(("raised", "status", "expected"), MAPPED, ids=lambda v: repr(v)[:40])
async def test_errors_map_to_statuses_and_back_to_the_same_class(
    raised: Exception, status: int, expected: type[Exception]
) -> None:
    fake = FakeControl()
    run = fake.add_run()
    fake.failure = raised
    async with served(fake) as (client, url), raw() as session:
        async with session.get(f"{url}/v1/runs/{run.run_id}") as response:
            assert response.status == status
            document = await response.json()
        assert document["error"] == expected.__name__
        assert "\n" not in document["message"]
        with pytest.raises(expected) as caught:
            await client.get_run(run.run_id)
        assert type(caught.value) is expected
        assert str(raised).split()[0] in str(caught.value)


async def test_an_unexpected_error_is_a_500_without_detail_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeControl()
    fake.failure = KeyError("/home/link/secret.db")
    async with served(fake) as (client, url), raw() as session:
        async with session.get(f"{url}/v1/runs") as response:
            assert response.status == 500
            text = await response.text()
        assert "secret" not in text
        assert "KeyError" not in text
        assert json.loads(text) == {"error": "", "message": "internal error"}
        with pytest.raises(FedcoreError) as caught:
            await client.list_runs()
        assert type(caught.value) is FedcoreError
        assert "secret" not in str(caught.value)
        logged = [r for r in caplog.records if r.name == "fedcore.transport.http.server"]
        assert logged
        assert logged[0].exc_info
        fake.failure = None
        assert await client.health()


async def test_the_client_tells_answers_that_are_not_fedcore_ones() -> None:
    async def teapot(request: web.Request) -> web.Response:
        return web.Response(status=418, text="<html>I'm a teapot</html>")

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def html_404(request: web.Request) -> web.Response:
        return web.Response(status=404, text="<h1>Not Found</h1>")

    async def proxy_502(request: web.Request) -> web.Response:
        return web.Response(status=502, text="bad gateway")

    async def forged(request: web.Request) -> web.Response:
        return web.json_response({"error": "ConflictError", "message": "?"}, status=404)

    app = web.Application()
    app.router.add_get("/v1/health", teapot)
    app.router.add_get("/v1/runs", not_json)
    app.router.add_get("/v1/runs/1", html_404)
    app.router.add_get("/v1/nodes", proxy_502)
    app.router.add_get("/v1/runs/2", forged)
    async with (
        serve_http(app, "127.0.0.1", 0) as port,
        HttpControlClient("127.0.0.1", port) as client,
    ):
        # An error that is not fedcore's document: the address is not the control API.
        where = f"127.0.0.1:{port} is not a fedcore control API"
        with pytest.raises(WrongServiceError, match=f"{where} .*GET /v1/health with HTTP 418"):
            await client.health()
        with pytest.raises(DecodeError, match="not a JSON document"):
            await client.list_runs()
        with pytest.raises(WrongServiceError, match=f"{where} .*GET /v1/runs/1 with HTTP 404"):
            await client.get_run(1)
        with pytest.raises(LinkUnavailableError, match="HTTP 502"):
            await client.list_nodes()
        with pytest.raises(NotFoundError) as forged_error:
            await client.get_run(2)  # a 404 naming a ConflictError is still a NotFoundError
        assert type(forged_error.value) is NotFoundError


async def test_nothing_listening_is_link_unavailable() -> None:
    port = closed_port()
    async with HttpControlClient("127.0.0.1", port) as client:
        with pytest.raises(LinkUnavailableError, match=f"127.0.0.1:{port}"):
            await client.health()
        with pytest.raises(LinkUnavailableError):
            await client.submit_run(ZIP, {})
        with pytest.raises(LinkUnavailableError):
            await anext(client.logs(1, follow=True))


async def test_a_link_that_goes_away_mid_stream_is_link_unavailable() -> None:
    fake = FakeControl()
    run = fake.add_run()
    fake.append(run.run_id, "one")
    server = serve_http(control_app(fake), "127.0.0.1", 0, shutdown_seconds=0.1)
    port = await server.__aenter__()
    async with HttpControlClient("127.0.0.1", port) as client:
        lines = client.logs(run.run_id, follow=True)
        with anyio.fail_after(5):
            assert (await anext(lines)).text == "one"
            await server.__aexit__(None, None, None)
            with pytest.raises(LinkUnavailableError):
                await anext(lines)


async def test_a_client_outside_its_block_says_so() -> None:
    client = HttpControlClient("127.0.0.1", 1)
    with pytest.raises(RuntimeError, match="async with"):
        await client.health()


# ------------------------------------------------------------------- the token


async def test_with_a_token_every_route_requires_it_and_health_tells_a_stranger_only_ok() -> None:
    fake = FakeControl()
    run = fake.add_run()
    fake.append(run.run_id, "one")
    async with served(fake, token=TOKEN) as (_, url), raw() as session:
        routes = [
            ("GET", "/v1/runs"),
            ("GET", f"/v1/runs/{run.run_id}"),
            ("POST", f"/v1/runs/{run.run_id}/stop"),
            ("GET", f"/v1/runs/{run.run_id}/logs"),
            ("GET", f"/v1/runs/{run.run_id}/metrics"),
            ("GET", f"/v1/runs/{run.run_id}/artifacts/model"),
            ("GET", "/v1/nodes"),
            ("POST", "/v1/runs"),
        ]
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            for method, path in routes:
                async with session.request(method, url + path, headers=headers) as response:
                    assert response.status == 401, (method, path, headers)
                    assert response.headers["WWW-Authenticate"] == "Bearer"
                    assert TOKEN not in await response.text()
        async with session.get(f"{url}/v1/health") as response:
            assert response.status == 200
            assert await response.json() == {"status": "ok"}
        for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}):
            async with session.get(f"{url}/v1/health", headers=headers) as response:
                assert response.status == 401, headers
        good = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(f"{url}/v1/runs", headers=good) as response:
            assert response.status == 200
        async with session.get(f"{url}/v1/health", headers=good) as response:
            assert (await response.json())["version"] == "9.9.9"
    assert fake.runs[run.run_id].status is RunStatus.RUNNING  # the refused stop did nothing


async def test_the_client_presents_its_token() -> None:
    fake = FakeControl()
    async with served(fake, token=TOKEN, client_token=TOKEN) as (client, _):
        run = await client.submit_run(ZIP, {"a": 1})
        assert await client.get_run(run.run_id) == run
    async with served(fake, token=TOKEN, client_token="nope") as (client, _):
        with pytest.raises(AuthenticationError, match="bearer token"):
            await client.list_runs()
        with pytest.raises(AuthenticationError, match="bearer token"):
            await client.submit_run(ZIP, {})
        with pytest.raises(AuthenticationError, match="bearer token"):
            await client.health()
    async with served(fake, token=TOKEN, client_token=TOKEN) as (client, _):
        assert await client.health() == Health("9.9.9", 2, 2)
    assert len(fake.bundles) == 1


# ------------------------------------------------------------------- caps and garbage


async def test_a_bundle_over_the_cap_is_refused_before_it_is_sent() -> None:
    fake = FakeControl()
    async with served(fake, max_bundle_bytes=1000) as (client, _):
        with pytest.raises(BundleError, match="over the cap"):
            await client.submit_run(ZIP + bytes(3 << 20), {})
        assert fake.bundles == {}
        run = await client.submit_run(ZIP[:900], {})  # the server is fine, and takes this one
        assert fake.bundles[run.run_id] == ZIP[:900]


async def test_a_bundle_part_over_the_cap_is_refused_as_it_arrives() -> None:
    # Declared length within the room for a config part: only counting the bundle finds it.
    fake = FakeControl()
    async with served(fake, max_bundle_bytes=1000) as (client, _):
        with pytest.raises(BundleError, match="bundle part is over the cap of 1000"):
            await client.submit_run(ZIP + bytes(5000), {})
        assert fake.bundles == {}


async def test_a_declared_length_over_the_cap_is_refused_without_reading_the_body() -> None:
    fake = FakeControl()
    async with served(fake) as (client, url):
        port = int(url.rsplit(":", 1)[1])
        request = (
            b"POST /v1/runs HTTP/1.1\r\nHost: link\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n"
            b"Content-Length: 1000000000\r\n\r\n" + bytes(100)
        )
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request)  # and never the rest: a buffering server would wait
                answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 413")
        assert b'"error":"BundleError"' in answer
        assert fake.bundles == {}
        assert await client.health()


GARBAGE: list[tuple[str, dict[str, str], bytes]] = [
    ("not multipart", {"Content-Type": "application/zip"}, ZIP),
    ("no boundary", {"Content-Type": "multipart/form-data"}, b"--x\r\n\r\n"),
    ("no parts", {"Content-Type": "multipart/form-data; boundary=b"}, b"garbage"),
    ("only the end", {"Content-Type": "multipart/form-data; boundary=b"}, b"--b--\r\n"),
    (
        "header soup",
        {"Content-Type": "multipart/form-data; boundary=b"},
        b"--b\r\nContent-Disposition: \x00\x01;;;=\r\n\r\n{}\r\n--b--\r\n",
    ),
    (
        "long header",
        {"Content-Type": "multipart/form-data; boundary=b"},
        b"--b\r\nX: " + b"a" * 20000 + b"\r\n\r\n{}\r\n--b--\r\n",
    ),
    (
        "compressed",
        {"Content-Type": "multipart/form-data; boundary=b", "Content-Encoding": "gzip"},
        b"x",
    ),
]


@pytest.mark.parametrize(("what", "headers", "body"), GARBAGE, ids=[g[0] for g in GARBAGE])
async def test_garbage_submissions_are_400(what: str, headers: dict[str, str], body: bytes) -> None:
    fake = FakeControl()
    async with served(fake) as (client, url), raw() as session:
        async with session.post(f"{url}/v1/runs", data=body, headers=headers) as response:
            assert response.status == 400, what
            document = await response.json()
        assert document["error"] == "DecodeError"
        assert fake.bundles == {}
        assert await client.health()


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ([("bundle", ZIP, "application/zip")], "must be 'config'"),
        ([("config", b"{}", "application/json")], "must be 'bundle'"),
        ([("config", b"{nope", "application/json"), ("bundle", ZIP, "x")], "not a JSON document"),
        ([("config", b"[1]", "application/json"), ("bundle", ZIP, "x")], "must be an object"),
        ([("config", b'{"a": [1]}', "application/json"), ("bundle", ZIP, "x")], "'a' must be"),
        ([("config", b'{"a": 1, "a": 2}', "application/json"), ("bundle", ZIP, "x")], "repeats"),
        ([("config", b'{"a": 99999999999999999999}', "x"), ("bundle", ZIP, "x")], "64 bits"),
        ([("config", b"[" * 100000, "x"), ("bundle", ZIP, "x")], "not a JSON document"),
        (
            [("config", b"{}", "x"), ("bundle", ZIP, "x"), ("extra", b"", "x")],
            "two parts",
        ),
    ],
)
async def test_malformed_parts_are_400(parts: list[tuple[str, bytes, str]], match: str) -> None:
    fake = FakeControl()
    async with (
        served(fake) as (_, url),
        raw() as session,
        session.post(f"{url}/v1/runs", data=multipart(*parts)) as response,
    ):
        assert response.status == 400
        assert match in (await response.json())["message"]
    assert fake.bundles == {}


async def test_a_config_part_over_its_cap_is_413() -> None:
    fake = FakeControl()
    config = json.dumps({"k": "x" * (2 << 20)}).encode()
    async with served(fake) as (_, url), raw() as session:
        body = multipart(("config", config, "application/json"), ("bundle", ZIP, "x"))
        async with session.post(f"{url}/v1/runs", data=body) as response:
            assert response.status == 413
            assert (await response.json())["error"] == "UsageError"


async def test_a_submission_must_declare_its_length() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"--b\r\n"

    fake = FakeControl()
    async with served(fake) as (_, url), raw() as session:
        headers = {"Content-Type": "multipart/form-data; boundary=b"}
        async with session.post(f"{url}/v1/runs", data=chunks(), headers=headers) as response:
            assert response.status == 400
            assert "Content-Length" in (await response.json())["message"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs/abc",
        "/v1/runs/-1",
        "/v1/runs/007",
        "/v1/runs/99999999999999999999",
        "/v1/runs/9223372036854775808",
        "/v1/runs/1/logs?after=x",
        "/v1/runs/1/logs?after=-1",
        "/v1/runs/1/logs?follow=maybe",
        "/v1/runs/1/metrics?after=x",
        "/v1/runs/1/metrics?follow=maybe",
        "/v1/runs/abc/artifacts/model",
    ],
)
async def test_bad_ids_and_queries_are_400(path: str) -> None:
    fake = FakeControl()
    fake.add_run()
    async with served(fake) as (_, url), raw() as session, session.get(url + path) as response:
        assert response.status == 400
        assert (await response.json())["error"] == "DecodeError"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=300), boundary=st.sampled_from(["b", "x" * 70, "=?"]))
async def test_random_multipart_bodies_are_never_a_500(body: bytes, boundary: str) -> None:
    fake = FakeControl()
    async with served(fake) as (_, url), raw() as session:
        for data in (body, b"--" + boundary.encode() + b"\r\n" + body):
            headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
            async with session.post(f"{url}/v1/runs", data=data, headers=headers) as response:
                assert response.status in (201, 400, 413), await response.text()


async def test_unknown_routes_and_methods_are_not_served() -> None:
    async with served(FakeControl()) as (client, url), raw() as session:
        async with session.get(f"{url}/v1/nope") as response:
            assert response.status == 404
        async with session.delete(f"{url}/v1/runs") as response:
            assert response.status == 405
        assert await client.health()


# ------------------------------------------------------------------- a run's record


async def test_metrics_lines_come_as_sent_nan_included_and_a_follow_ends_with_the_run() -> None:
    fake = FakeControl()
    run = fake.add_run()
    header = {"run": run.run_id, "seed": 3, "app": "ünï"}
    fake.report(run.run_id, header)
    fake.report(run.run_id, {"round": 1, "server": {"loss": math.nan}})
    async with served(fake) as (client, url), raw() as session:
        lines = [line async for line in client.metrics(run.run_id)]
        assert [line.seq for line in lines] == [1, 2]
        assert lines[0].document == header
        assert math.isnan(lines[1].document["server"]["loss"])
        assert [line.seq async for line in client.metrics(run.run_id, after=1)] == [2]
        async with session.get(f"{url}/v1/runs/{run.run_id}/metrics?after=1") as response:
            assert response.content_type == "application/x-ndjson"
            expected = '{"seq":2,"document":{"round":1,"server":{"loss":NaN}}}\n'
            assert await response.text() == expected
    send, receive = anyio.create_memory_object_stream[MetricsLine](10)
    async with served(fake) as (client, _), receive, anyio.create_task_group() as tasks:

        async def follow() -> None:
            async with send:
                async for line in client.metrics(run.run_id, after=1, follow=True):
                    await send.send(line)

        tasks.start_soon(follow)
        with anyio.fail_after(5):
            assert (await receive.receive()).seq == 2
            fake.report(run.run_id, {"round": 2})
            fake.finish(run.run_id)
            assert [line.document async for line in receive] == [{"round": 2}]


async def test_an_artifact_comes_back_whole_and_a_missing_one_is_not_found() -> None:
    fake = FakeControl()
    run, other = fake.add_run(), fake.add_run()
    weights = np.arange(300_000, dtype=np.float32)  # over the spool threshold: streamed
    model = RecordDict({"arrays": ArrayRecord({"w": weights})})
    fake.artifacts[run.run_id, "model"] = model
    async with served(fake) as (client, _):
        assert await client.get_artifact(run.run_id, "model") == model
        with pytest.raises(NotFoundError, match="keeps no model") as missing:
            await client.get_artifact(other.run_id, "model")
        assert not isinstance(missing.value, RunNotFoundError)
        with pytest.raises(RunNotFoundError):
            await client.get_artifact(BIG_ID - 1, "model")
        with pytest.raises(RunNotFoundError):
            [line async for line in client.metrics(BIG_ID - 1)]


async def test_the_page_is_served_without_a_token_and_with_its_policy() -> None:
    fake = FakeControl()
    async with served(fake, token=TOKEN) as (_, url), raw() as session:
        for path, kind in [
            ("/ui", "text/html"),
            ("/ui/index.html", "text/html"),
            ("/ui/app.js", "text/javascript"),
            ("/ui/style.css", "text/css"),
        ]:
            async with session.get(url + path) as response:
                assert response.status == 200, path
                assert response.content_type == kind
                policy = response.headers["Content-Security-Policy"]
                assert "default-src 'none'" in policy
                assert "script-src 'self'" in policy
                assert "unsafe-inline" not in policy
                assert response.headers["X-Content-Type-Options"] == "nosniff"
                assert response.headers["Referrer-Policy"] == "no-referrer"
                assert TOKEN not in await response.text()
        for path in ("/ui/nope.js", "/ui/../v1/runs", "/ui/%2e%2e/v1/runs"):
            async with session.get(url + path) as response:
                assert response.status in (401, 404), path
        async with session.post(f"{url}/ui") as response:
            assert response.status == 405


def test_the_page_writes_run_supplied_text_as_text_never_markup() -> None:
    script = (Path(page.__file__).parent / "ui" / "app.js").read_text()
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert unsafe not in script
    html = (Path(page.__file__).parent / "ui" / "index.html").read_text()
    assert "<script>" not in html  # the policy allows no inline script: none is needed
    assert "http://" not in html.replace("http://www.w3.org", "")
