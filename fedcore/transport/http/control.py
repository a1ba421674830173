"""The control API over HTTP: what ``fedcore run / ls / log / stop`` send to the link.

:func:`control_app` serves any :class:`~fedcore.transport.control.ControlService`;
:class:`HttpControlClient` is one, remotely. Bodies are JSON (see
:mod:`fedcore.transport.http.bodies`; run ids are decimal strings), errors follow
:mod:`fedcore.transport.http.errors`. The routes::

    POST /v1/runs                    multipart/form-data: a part "config" (application/json,
                                     the run config object), then a part "bundle"
                                     (application/zip) -> 201, the run
    GET  /v1/runs                    -> {"runs": [run, ...]}, oldest first
    GET  /v1/runs/{run_id}           -> the run
    POST /v1/runs/{run_id}/stop      -> the run
    GET  /v1/runs/{run_id}/logs?after=N&follow=1
                                     -> application/x-ndjson: one log line object per line,
                                        as they come; a last {"status", "error", "message"}
                                        line if the stream failed on the way
    GET  /v1/runs/{run_id}/metrics?after=N&follow=1
                                     -> application/x-ndjson, as the logs: one
                                        {"seq": n, "document": {...}} per metrics line
    GET  /v1/runs/{run_id}/artifacts/{name}
                                     -> application/vnd.fedcore.recorddict: the artifact
                                        (its final model: "model"); 404 when it keeps none
    GET  /v1/nodes                   -> {"nodes": [{"node_id": "7", "online": true}, ...]}
    GET  /v1/nodes/authorized        -> {"keys": ["ssh-ed25519 AAAA… comment", ...]}
    POST /v1/nodes/authorized        {"public_key": text} -> {"keys": [...]}, the list after
    POST /v1/nodes/authorized/remove {"public_key": text} -> {"keys": [...]}
    GET  /v1/health                  -> {"version", "runs_active", "nodes_online"}; asked
                                        with no Authorization: {"status": "ok"}
    GET  /v1/metrics                 -> {"loop_lag_max_ms": {"last_minute", "since_start"},
                                         "loop_lag_histogram_ms": {...}}, from ``metrics``
    GET  /ui, /ui/{file}             the link's page (:mod:`fedcore.transport.http.page`):
                                     static files, no token needed to load them; the
                                     page itself presents the token on every call above

A metrics document travels as the ServerApp wrote it, a diverged loss as ``NaN``
(Python's JSON, and ``metrics.jsonl``'s); the page reads that too.

With a token (the link always has one: :mod:`fedcore.auth.control_token`), every
route requires ``Authorization: Bearer <token>`` (401 otherwise, with a one-line
reason), health included, save that health asked with no credential at all answers
that the link is up and nothing else — what a load balancer's probe needs, and no
stranger's business beyond it (no version, no counts). A submission must declare its
length, which may not exceed what the bundle cap allows; with ``Expect: 100-continue``
(as the client sends) a refusal (401, 413) comes before any of the bundle is sent.
Past the declared length, the bundle part is still counted as it arrives and refused
once over the cap.
"""

from __future__ import annotations

import logging
import ssl as _ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote

import aiohttp
from aiohttp import BodyPartReader, MultipartReader, hdrs, web
from aiohttp.http import HttpProcessingError

from fedcore.apps.bundle import MAX_BUNDLE_BYTES
from fedcore.auth.admission import Arrival, admit
from fedcore.auth.control_token import BearerToken
from fedcore.domain import LogLine, MetricsLine, Run
from fedcore.errors import (
    AuthenticationError,
    BundleError,
    DecodeError,
    FedcoreError,
    UsageError,
)
from fedcore.transport.control import ControlService, Health, NodeInfo
from fedcore.transport.http import bodies
from fedcore.transport.http.bodies import (
    JSON,
    MAX_JSON_BYTES,
    MAX_PAYLOAD_BYTES,
    RECORDDICT,
    dumps,
    loads,
)
from fedcore.transport.http.errors import (
    INTERNAL,
    error_document,
    error_from,
    expected_error,
    too_large,
    unauthorized,
)
from fedcore.transport.http.page import add_page
from fedcore.transport.http.server import (
    Handler,
    guarded,
    payload_response,
    refuse_compressed,
    request_body,
)
from fedcore.transport.http.session import TIMEOUT, Body, Session, SessionClient

if TYPE_CHECKING:  # types only: the fleet codec (betterproto) stays out of `fedcore ls`,
    from fedcore.domain import (
        RecordDict,  # and records (numpy) out of `fedcore log`
        UserConfigValue,
    )

__all__ = ["HttpControlClient", "control_app"]

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 1 << 20
"""The largest run config part a submission may carry."""
NDJSON = "application/x-ndjson"
PUBLIC_HEALTH = {"status": "ok"}
"""All that health tells a client that presents no credential."""
_MULTIPART_SLACK = 64 * 1024
"""Room in a submission for the multipart framing around its two parts."""
_CHUNK = 1 << 16
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MULTIPART_FAULTS = (ValueError, RuntimeError, AssertionError, HttpProcessingError, Warning)
"""What aiohttp's multipart reader raises on a malformed body (a bad Content-Disposition
is a warning, an exception where warnings are errors)."""


def control_app(
    service: ControlService,
    *,
    token: str | None = None,
    max_bundle_bytes: int = MAX_BUNDLE_BYTES,
    metrics: Callable[[], Mapping[str, object]] | None = None,
) -> web.Application:
    """An aiohttp application serving ``service`` as the control API.

    With ``token``, requests must carry it as a bearer token (see the module's notes on
    health). ``max_bundle_bytes`` caps a submitted bundle. ``metrics`` (a JSON object's
    content, made on each request) is served at ``/v1/metrics`` when given.
    """
    handlers = _ControlHandlers(service, token, max_bundle_bytes)
    app = web.Application(client_max_size=MAX_JSON_BYTES)
    routes = app.router
    routes.add_post(
        "/v1/runs",
        handlers.route(handlers.submit_run),
        expect_handler=guarded(handlers.expect_submission),
    )
    routes.add_get("/v1/runs", handlers.route(handlers.list_runs), allow_head=False)
    routes.add_get("/v1/runs/{run_id}", handlers.route(handlers.get_run), allow_head=False)
    routes.add_post("/v1/runs/{run_id}/stop", handlers.route(handlers.stop_run))
    routes.add_get("/v1/runs/{run_id}/logs", handlers.route(handlers.logs), allow_head=False)
    routes.add_get("/v1/runs/{run_id}/metrics", handlers.route(handlers.metrics), allow_head=False)
    routes.add_get(
        "/v1/runs/{run_id}/artifacts/{name}",
        handlers.route(handlers.get_artifact),
        allow_head=False,
    )
    routes.add_get("/v1/nodes", handlers.route(handlers.list_nodes), allow_head=False)
    routes.add_get(
        "/v1/nodes/authorized", handlers.route(handlers.authorized_nodes), allow_head=False
    )
    routes.add_post("/v1/nodes/authorized", handlers.route(handlers.authorize_node))
    routes.add_post("/v1/nodes/authorized/remove", handlers.route(handlers.deauthorize_node))
    routes.add_get("/v1/health", handlers.route(handlers.health, public=True), allow_head=False)
    if metrics is not None:
        routes.add_get("/v1/metrics", handlers.route(_metrics_handler(metrics)), allow_head=False)
    add_page(routes)
    return app


def _metrics_handler(metrics: Callable[[], Mapping[str, object]]) -> Handler:
    async def serve_metrics(request: web.Request) -> web.StreamResponse:
        return _json(dict(metrics()))

    return serve_metrics


class _Numbered(Protocol):
    @property
    def seq(self) -> int: ...


Line = TypeVar("Line", bound=_Numbered)


class _ControlHandlers:
    def __init__(self, service: ControlService, token: str | None, max_bundle: int) -> None:
        self._service = service
        self._door = BearerToken(token) if token else None
        self._max_bundle = max_bundle
        self._max_submission = max_bundle + MAX_CONFIG_BYTES + _MULTIPART_SLACK

    def route(self, handler: Handler, *, public: bool = False) -> Handler:
        async def authorized(request: web.Request) -> web.StreamResponse:
            if not public:
                await self._authorize(request)
            return await handler(request)

        return guarded(authorized)

    async def _authorize(self, request: web.BaseRequest) -> None:
        if self._door is None:
            return
        try:
            await admit(
                self._door, Arrival(request.method, request.headers, request.read, request.raw_path)
            )
        except AuthenticationError:
            raise unauthorized() from None

    async def expect_submission(self, request: web.Request) -> None:
        """Refuse a submission before its body is sent, or let the client send it."""
        if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
            raise web.HTTPExpectationFailed()
        await self._authorize(request)
        self._check_submission_size(request)
        if request.version == aiohttp.HttpVersion11:
            await request.writer.write(_CONTINUE)

    def _check_submission_size(self, request: web.BaseRequest) -> None:
        refuse_compressed(request)
        declared = request.content_length
        if declared is None:
            raise DecodeError("a run submission must declare its Content-Length")
        if declared > self._max_submission:
            raise too_large(
                BundleError,
                f"a submission of {declared} bytes is over the cap for a bundle of at most "
                f"{self._max_bundle} bytes",
            )

    async def submit_run(self, request: web.Request) -> web.StreamResponse:
        self._check_submission_size(request)
        if request.content_type != "multipart/form-data":
            raise DecodeError("a run submission must be multipart/form-data")
        try:
            reader = await request.multipart()
            config = bodies.config_from_json(
                loads(await _part(reader, "config", MAX_CONFIG_BYTES, UsageError))
            )
            bundle = await _part(reader, "bundle", self._max_bundle, BundleError)
            if await reader.next() is not None:
                raise DecodeError("a run submission has two parts: config and bundle")
        except FedcoreError:
            raise
        except _MULTIPART_FAULTS as exc:
            raise DecodeError(f"a malformed multipart body: {exc}") from exc
        run = await self._service.submit_run(bundle, config)
        return _json(bodies.run_to_json(run), status=201, location=f"/v1/runs/{run.run_id}")

    async def list_runs(self, request: web.Request) -> web.StreamResponse:
        runs = await self._service.list_runs()
        return _json({"runs": [bodies.run_to_json(run) for run in runs]})

    async def get_run(self, request: web.Request) -> web.StreamResponse:
        return _json(bodies.run_to_json(await self._service.get_run(_run_id(request))))

    async def stop_run(self, request: web.Request) -> web.StreamResponse:
        return _json(bodies.run_to_json(await self._service.stop_run(_run_id(request))))

    async def logs(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, self._service.logs, bodies.log_line_to_json)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, self._service.metrics, bodies.metrics_line_to_json)

    async def _stream(
        self,
        request: web.Request,
        source: Callable[..., AsyncIterator[Line]],
        to_json: Callable[[Line], dict[str, Any]],
    ) -> web.StreamResponse:
        """A run's numbered lines, each written as soon as the service yields it.

        The run is looked up first, so that an unknown one is a 404. Once the
        stream has begun, a failure can only be told in the stream: its last line.
        """
        run_id = _run_id(request)
        after = _query_id(request, "after")
        follow = _query_flag(request, "follow")
        await self._service.get_run(run_id)
        response = web.StreamResponse(headers={hdrs.CONTENT_TYPE: NDJSON})
        await response.prepare(request)
        lines = source(run_id, after=after, follow=follow)
        try:
            async for line in lines:
                await response.write(dumps(to_json(line)) + b"\n")
        except Exception as exc:
            if isinstance(exc, ConnectionError) and not isinstance(exc, FedcoreError):
                raise  # the client went away
            status, document = expected_error(exc) or (500, error_document(None, INTERNAL))
            if status == 500:
                log.exception("the %s stream of run %d failed", request.path, run_id)
            await response.write(dumps({"status": status, **document}) + b"\n")
        finally:
            if isinstance(lines, AsyncGenerator):
                await lines.aclose()
        await response.write_eof()
        return response

    async def get_artifact(self, request: web.Request) -> web.StreamResponse:
        from fedcore.wire import pack_recorddict_parts  # records: not for `fedcore ls`

        run_id = _run_id(request)
        content = await self._service.get_artifact(run_id, request.match_info["name"])
        return await payload_response(request, pack_recorddict_parts(content), RECORDDICT)

    async def list_nodes(self, request: web.Request) -> web.StreamResponse:
        nodes = await self._service.list_nodes()
        return _json({"nodes": [bodies.node_to_json(node) for node in nodes]})

    async def authorized_nodes(self, request: web.Request) -> web.StreamResponse:
        return _json({"keys": await self._service.authorized_nodes()})

    async def authorize_node(self, request: web.Request) -> web.StreamResponse:
        key = _public_key(await request_body(request, MAX_KEY_BODY, DecodeError))
        return _json({"keys": await self._service.authorize_node(key)})

    async def deauthorize_node(self, request: web.Request) -> web.StreamResponse:
        key = _public_key(await request_body(request, MAX_KEY_BODY, DecodeError))
        return _json({"keys": await self._service.deauthorize_node(key)})

    async def health(self, request: web.Request) -> web.StreamResponse:
        if self._door is not None and hdrs.AUTHORIZATION not in request.headers:
            return _json(PUBLIC_HEALTH)
        await self._authorize(request)
        return _json(bodies.health_to_json(await self._service.health()))


async def _part(
    reader: MultipartReader, name: str, cap: int, too_large_kind: type[FedcoreError]
) -> bytes:
    """The next part's bytes, which must be the part ``name``, refused once over ``cap``."""
    part = await reader.next()
    if not isinstance(part, BodyPartReader) or part.name != name:
        raise DecodeError(f"a run submission's next part must be {name!r}")
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > cap:
            raise too_large(too_large_kind, f"the {name} part is over the cap of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(document: object, *, status: int = 200, location: str | None = None) -> web.Response:
    headers = {hdrs.LOCATION: location} if location else None
    return web.Response(status=status, body=dumps(document), content_type=JSON, headers=headers)


def _run_id(request: web.Request) -> int:
    return bodies.id_from_json(request.match_info["run_id"], "the run id")


def _query_id(request: web.Request, name: str) -> int:
    return bodies.id_from_json(request.query.get(name, "0"), f"query parameter {name!r}")


def _query_flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value not in ("0", "1", "false", "true"):
        raise DecodeError(f"query parameter {name!r} must be 1 or 0, got {value[:20]!r}")
    return value in ("1", "true")


class HttpControlClient(SessionClient, ControlService):
    """The control API of the link at ``host:port``; use it as an async context manager.

    ``token`` is sent as a bearer token. ``timeout`` bounds each call (a followed
    log only while connecting: it may stay quiet for as long as the run does).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: _ssl.SSLContext | None = None,
        token: str | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self._session = Session(host, port, ssl=ssl, timeout=timeout, api="control API")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def submit_run(self, bundle: bytes, run_config: Mapping[str, UserConfigValue]) -> Run:
        with aiohttp.MultipartWriter("form-data") as body:
            config = body.append(dumps(bodies.config_to_json(run_config)), {"Content-Type": JSON})
            config.set_content_disposition("form-data", name="config")
            archive = body.append_payload(Body(bytes(bundle), "application/zip"))
            archive.set_content_disposition("form-data", name="bundle", filename="bundle.zip")
        return bodies.run_from_json(await self._json("POST", "/v1/runs", data=body, expect100=True))

    async def list_runs(self) -> list[Run]:
        return bodies.runs_from_json(await self._json("GET", "/v1/runs"))

    async def get_run(self, run_id: int) -> Run:
        return bodies.run_from_json(await self._json("GET", f"/v1/runs/{_id(run_id)}"))

    async def stop_run(self, run_id: int) -> Run:
        return bodies.run_from_json(await self._json("POST", f"/v1/runs/{_id(run_id)}/stop"))

    def logs(self, run_id: int, *, after: int = 0, follow: bool = False) -> AsyncIterator[LogLine]:
        path = f"/v1/runs/{_id(run_id)}/logs"
        return self._lines(path, after, follow, bodies.log_line_from_json)

    def metrics(
        self, run_id: int, *, after: int = 0, follow: bool = False
    ) -> AsyncIterator[MetricsLine]:
        path = f"/v1/runs/{_id(run_id)}/metrics"
        return self._lines(path, after, follow, bodies.metrics_line_from_json)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        from fedcore.wire import DecodeLimits, unpack_recorddict  # records: not for `fedcore ls`

        body = await self._session.fetch_payload(
            "GET",
            f"/v1/runs/{_id(run_id)}/artifacts/{quote(name, safe='')}",
            headers=self._headers,
            cap=MAX_PAYLOAD_BYTES,
        )
        return unpack_recorddict(body, DecodeLimits(max_bytes=MAX_PAYLOAD_BYTES))

    async def _lines(
        self, path: str, after: int, follow: bool, from_json: Callable[[object], Line]
    ) -> AsyncIterator[Line]:
        """An NDJSON stream of numbered lines, each yielded as soon as it is whole."""
        session = self._session
        params = {"after": _id(after), "follow": "1" if follow else "0"}
        timeout = session.stream_timeouts() if follow else session.timeouts()
        async with session.request(
            "GET", path, headers=self._headers, params=params, timeout=timeout
        ) as response:
            buffer, start = bytearray(), 0
            while True:
                end = buffer.find(b"\n", start)
                if end >= 0:
                    document = bodies.fields(loads(buffer[start:end]), "a stream line")
                    start = end + 1
                    if "error" in document:
                        status = document.get("status")
                        status = status if type(status) is int else 500
                        raise error_from(status, document, session.where)
                    yield from_json(document)
                    continue
                del buffer[:start]
                start = 0
                if len(buffer) > MAX_JSON_BYTES:
                    raise DecodeError(f"{session.where} sent a line over {MAX_JSON_BYTES} bytes")
                chunk = await response.content.readany()
                if not chunk:
                    break
                buffer += chunk
            if buffer:
                raise DecodeError(f"{session.where} ended the stream inside a line")

    async def list_nodes(self) -> list[NodeInfo]:
        return bodies.nodes_from_json(await self._json("GET", "/v1/nodes"))

    async def authorized_nodes(self) -> list[str]:
        return _keys(await self._json("GET", "/v1/nodes/authorized"))

    async def authorize_node(self, public_key: str) -> list[str]:
        body = dumps({"public_key": public_key})
        return _keys(await self._json("POST", "/v1/nodes/authorized", data=body))

    async def deauthorize_node(self, public_key: str) -> list[str]:
        body = dumps({"public_key": public_key})
        return _keys(await self._json("POST", "/v1/nodes/authorized/remove", data=body))

    async def health(self) -> Health:
        return bodies.health_from_json(await self._json("GET", "/v1/health"))

    async def _json(
        self, method: str, path: str, *, data: Any = None, expect100: bool = False
    ) -> Any:
        body = await self._session.call(
            method, path, headers=self._headers, data=data, expect100=expect100
        )
        return loads(body)


MAX_KEY_BODY = 32 * 1024
"""Bytes of a request that names a public key (a key is a few hundred)."""


def _public_key(body: bytes) -> str:
    document = loads(body)
    key = document.get("public_key") if isinstance(document, dict) else None
    if not isinstance(key, str):
        raise DecodeError('the body must be {"public_key": "<OpenSSH or PEM text>"}')
    return key


def _keys(document: object) -> list[str]:
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
        raise DecodeError('the answer must be {"keys": [...]}')
    return keys


def _id(value: int) -> str:
    """An id for a path or query, checked here: a bad one is the caller's bug."""
    return bodies.id_to_json(value)
