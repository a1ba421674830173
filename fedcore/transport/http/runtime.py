"""The runtime API over HTTP: what a ServerApp process asks of the link for its run.

:func:`runtime_app` serves any :class:`~fedcore.transport.runtime.RuntimeService`;
:class:`HttpRuntimeClient` is one, remotely. Every request names its run and
presents the run's launch secret::

    X-Fedcore-Run: <run id, decimal>
    Authorization: Bearer <launch secret>

and the server calls :meth:`~fedcore.transport.runtime.RuntimeService.authenticate`
before anything else, reading no body first: a missing header, an unknown run and a
wrong secret all answer the same 404 (RunNotFoundError, same message). Messages and
records travel as fedcore.wire payloads, never JSON; the rest is small JSON
(:mod:`fedcore.transport.http.bodies`). The routes::

    GET  /v1/runtime/run             -> the run (JSON)
    POST /v1/runtime/heartbeat       {"heartbeat_interval": s} -> the run
    GET  /v1/runtime/nodes?at_least=N&wait_seconds=S -> {"node_ids": ["7", ...]}
    POST /v1/runtime/messages        a message batch -> {"message_ids": [...]}
    POST /v1/runtime/replies/pull    {"message_ids": [...], "wait_seconds": s} -> a message batch
                                     ("message_ids": null: every reply the run holds)
    POST /v1/runtime/replies/ack     {"message_ids": [...]} -> 204
    GET  /v1/runtime/context         -> a RecordDict payload
    PUT  /v1/runtime/context         a RecordDict payload -> 204
    POST /v1/runtime/logs            {"lines": ["...", ...], "batch": "..."} -> 204
    POST /v1/runtime/metrics         {"documents": [{...}, ...], "batch": "..."} -> 204
    PUT  /v1/runtime/artifacts/{name}  a RecordDict payload -> 204
    POST /v1/runtime/finish          {"status": "finished:completed", "reason": ""} -> the run

A message batch (:mod:`fedcore.wire.batch`) packs a content shared by many messages
once. Every body has a cap (``max_body_bytes`` for payloads, 16 MiB for JSON), both
ways: the client splits a push that would be larger into several requests, and the
server answers a pull with as many of the replies as fit; the others stay stored
(until acknowledged) and come with the next pull. Waits (``wait_seconds``) happen
in the service; the client's timeout for such a call is the wait plus its own.
Payloads are decoded off the event loop past a few KiB (:mod:`fedcore.transport.off_loop`),
within the run's budget of objects (:data:`~fedcore.wire.frame.MAX_RUN_OBJECTS`): a
batch holds a header for each of its messages.
"""

from __future__ import annotations

import math
import ssl as _ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any
from urllib.parse import quote

from aiohttp import web

from fedcore.auth.admission import bearer
from fedcore.domain import Message, RecordDict, Run, RunStatus
from fedcore.errors import DecodeError, RunNotFoundError
from fedcore.transport.http import bodies
from fedcore.transport.http.bodies import (
    JSON,
    MAX_JSON_BYTES,
    MAX_PAYLOAD_BYTES,
    RECORDDICT,
    dumps,
    loads,
)
from fedcore.transport.http.server import (
    Handler,
    guarded,
    payload_response,
    request_body,
    request_payload,
)
from fedcore.transport.http.session import TIMEOUT, Body, Session, SessionClient
from fedcore.transport.off_loop import decoded
from fedcore.transport.runtime import RuntimeService
from fedcore.wire import MAX_VALUE_LEN, DecodeLimits, pack_recorddict_parts, unpack_recorddict
from fedcore.wire.batch import batch_prefix, pack_batch_parts, unpack_batch
from fedcore.wire.frame import MAX_RUN_OBJECTS

__all__ = ["MAX_BODY_BYTES", "HttpRuntimeClient", "runtime_app"]

MAX_BODY_BYTES = MAX_PAYLOAD_BYTES
"""The largest payload body either side reads: a batch of messages, a context, an artifact."""
RUN_HEADER = "X-Fedcore-Run"
BATCH = "application/vnd.fedcore.batch"
_UNKNOWN_RUN = "unknown run, or not its launch secret"

_RunHandler = Callable[[web.Request, Run], Awaitable[web.StreamResponse]]


def runtime_app(
    service: RuntimeService,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_value_len: int = MAX_VALUE_LEN,
) -> web.Application:
    """An aiohttp application serving ``service`` as the runtime API.

    ``max_body_bytes`` caps a request's payload (a batch of messages, a context);
    it also bounds a pull's answer, which holds as many replies as fit.
    ``max_value_len`` caps one str or bytes value of a record in a request's payload.
    """
    handlers = _RuntimeHandlers(service, max_body_bytes, max_value_len)
    app = web.Application(client_max_size=max_body_bytes)
    routes, route = app.router, handlers.route
    routes.add_get("/v1/runtime/run", route(handlers.run), allow_head=False)
    routes.add_post("/v1/runtime/heartbeat", route(handlers.heartbeat))
    routes.add_get("/v1/runtime/nodes", route(handlers.get_node_ids), allow_head=False)
    routes.add_post("/v1/runtime/messages", route(handlers.push_messages))
    routes.add_post("/v1/runtime/replies/pull", route(handlers.pull_replies))
    routes.add_post("/v1/runtime/replies/ack", route(handlers.ack_replies))
    routes.add_get("/v1/runtime/context", route(handlers.load_context), allow_head=False)
    routes.add_put("/v1/runtime/context", route(handlers.save_context))
    routes.add_post("/v1/runtime/logs", route(handlers.append_logs))
    routes.add_post("/v1/runtime/metrics", route(handlers.append_metrics))
    routes.add_put("/v1/runtime/artifacts/{name}", route(handlers.put_artifact))
    routes.add_get("/v1/runtime/artifacts/{name}", route(handlers.get_artifact), allow_head=False)
    routes.add_post("/v1/runtime/finish", route(handlers.finish))
    return app


class _RuntimeHandlers:
    def __init__(self, service: RuntimeService, max_body: int, max_value_len: int) -> None:
        self._service = service
        self._max_body = max_body
        self._limits = _limits(max_body, max_value_len)

    def route(self, handler: _RunHandler) -> Handler:
        async def authenticated(request: web.Request) -> web.StreamResponse:
            return await handler(request, await self._authenticate(request))

        return guarded(authenticated)

    async def _authenticate(self, request: web.Request) -> Run:
        secret = bearer(request.headers)
        try:
            run_id = bodies.id_from_json(request.headers.get(RUN_HEADER), RUN_HEADER)
        except DecodeError:
            raise RunNotFoundError(_UNKNOWN_RUN) from None
        if not secret:
            raise RunNotFoundError(_UNKNOWN_RUN)
        try:
            return await self._service.authenticate(run_id, secret)
        except RunNotFoundError:
            raise RunNotFoundError(_UNKNOWN_RUN) from None

    async def _document(self, request: web.Request) -> dict[str, Any]:
        body = await request_body(request, MAX_JSON_BYTES, DecodeError)
        return bodies.fields(loads(body), "the request")

    async def run(self, request: web.Request, run: Run) -> web.StreamResponse:
        return _json(bodies.run_to_json(run))

    async def heartbeat(self, request: web.Request, run: Run) -> web.StreamResponse:
        interval = bodies.seconds(await self._document(request), "heartbeat_interval")
        return _json(bodies.run_to_json(await self._service.heartbeat(run.run_id, interval)))

    async def get_node_ids(self, request: web.Request, run: Run) -> web.StreamResponse:
        at_least = bodies.id_from_json(request.query.get("at_least", "0"), "'at_least'")
        wait = _query_seconds(request, "wait_seconds")
        node_ids = await self._service.get_node_ids(
            run.run_id, at_least=at_least, wait_seconds=wait
        )
        return _json({"node_ids": [bodies.id_to_json(node_id) for node_id in node_ids]})

    async def push_messages(self, request: web.Request, run: Run) -> web.StreamResponse:
        body = await request_payload(request, self._max_body, DecodeError)
        message_ids = await self._service.push_messages(
            run.run_id, await decoded(partial(unpack_batch, limits=self._limits), body)
        )
        return _json({"message_ids": message_ids})

    async def pull_replies(self, request: web.Request, run: Run) -> web.StreamResponse:
        document = await self._document(request)
        asked = bodies.texts_or_null(document, "message_ids")  # null: every reply held
        wait = bodies.seconds(document, "wait_seconds")
        replies = await self._service.pull_replies(run.run_id, asked, wait_seconds=wait)
        fitting = replies[: batch_prefix(replies, self._max_body)]
        return await payload_response(request, pack_batch_parts(fitting), BATCH)

    async def ack_replies(self, request: web.Request, run: Run) -> web.StreamResponse:
        message_ids = bodies.texts(await self._document(request), "message_ids")
        await self._service.ack_replies(run.run_id, message_ids)
        return web.Response(status=204)

    async def load_context(self, request: web.Request, run: Run) -> web.StreamResponse:
        state = await self._service.load_context(run.run_id)
        return await payload_response(request, pack_recorddict_parts(state), RECORDDICT)

    async def save_context(self, request: web.Request, run: Run) -> web.StreamResponse:
        body = await request_payload(request, self._max_body, DecodeError)
        state = await decoded(partial(unpack_recorddict, limits=self._limits), body)
        await self._service.save_context(run.run_id, state)
        return web.Response(status=204)

    async def append_logs(self, request: web.Request, run: Run) -> web.StreamResponse:
        document = await self._document(request)
        lines = bodies.texts(document, "lines")
        batch = bodies.text(document, "batch") if "batch" in document else ""
        await self._service.append_logs(run.run_id, lines, batch=batch)
        return web.Response(status=204)

    async def append_metrics(self, request: web.Request, run: Run) -> web.StreamResponse:
        document = await self._document(request)
        documents = document.get("documents")
        if not isinstance(documents, list):
            raise DecodeError("'documents' must be a list of objects")
        batch = bodies.text(document, "batch") if "batch" in document else ""
        lines = [bodies.metrics_document(line) for line in documents]
        await self._service.append_metrics(run.run_id, lines, batch=batch)
        return web.Response(status=204)

    async def put_artifact(self, request: web.Request, run: Run) -> web.StreamResponse:
        name = request.match_info["name"]
        body = await request_payload(request, self._max_body, DecodeError)
        content = await decoded(partial(unpack_recorddict, limits=self._limits), body)
        await self._service.put_artifact(run.run_id, name, content)
        return web.Response(status=204)

    async def get_artifact(self, request: web.Request, run: Run) -> web.StreamResponse:
        content = await self._service.get_artifact(run.run_id, request.match_info["name"])
        return await payload_response(request, pack_recorddict_parts(content), RECORDDICT)

    async def finish(self, request: web.Request, run: Run) -> web.StreamResponse:
        document = await self._document(request)
        status = _status(bodies.text(document, "status"))
        reason = bodies.text(document, "reason")
        return _json(bodies.run_to_json(await self._service.finish(run.run_id, status, reason)))


def _json(document: object) -> web.Response:
    return web.Response(body=dumps(document), content_type=JSON)


def _query_seconds(request: web.Request, name: str) -> float:
    problem = f"query parameter {name!r} must be a finite number of seconds, not negative"
    try:
        value = float(request.query.get(name, "0"))
    except ValueError:
        raise DecodeError(problem) from None
    if not 0 <= value < math.inf:
        raise DecodeError(problem)
    return value


def _status(value: str) -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:
        raise DecodeError(f"unknown run status {value[:40]!r}") from None


class HttpRuntimeClient(SessionClient, RuntimeService):
    """The runtime API of the link at ``host:port``, for a process holding ``secret``.

    Use it as an async context manager. ``secret`` is the launch secret every call
    presents (:meth:`authenticate` presents the one it is given). ``timeout``
    bounds each call beyond the wait it asks for; ``max_body_bytes`` caps each
    request's payload (a longer push is split) and the answers read; ``max_value_len``
    one str or bytes value of a record in the answers.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: str,
        ssl: _ssl.SSLContext | None = None,
        timeout: float = TIMEOUT,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> None:
        self._session = Session(host, port, ssl=ssl, timeout=timeout, api="runtime API")
        self._secret = secret
        self._max_body = max_body_bytes
        self._limits = _limits(max_body_bytes, max_value_len)

    async def authenticate(self, run_id: int, secret: str) -> Run:
        body = await self._call("GET", "/v1/runtime/run", run_id, secret=secret)
        return bodies.run_from_json(loads(body))

    async def heartbeat(self, run_id: int, heartbeat_interval: float) -> Run:
        request = {"heartbeat_interval": heartbeat_interval}
        body = await self._call("POST", "/v1/runtime/heartbeat", run_id, request)
        return bodies.run_from_json(loads(body))

    async def get_node_ids(
        self, run_id: int, *, at_least: int = 0, wait_seconds: float = 0.0
    ) -> list[int]:
        params = {"at_least": bodies.id_to_json(at_least), "wait_seconds": repr(wait_seconds)}
        body = await self._session.call(
            "GET",
            "/v1/runtime/nodes",
            headers=self._headers(run_id),
            params=params,
            timeout=self._session.timeouts(wait_seconds),
        )
        return bodies.ids_from_json(bodies.fields(loads(body), "an answer"), "node_ids")

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        message_ids: list[str] = []
        rest = list(messages)
        while True:
            count = batch_prefix(rest, self._max_body)
            body = await self._session.call(
                "POST",
                "/v1/runtime/messages",
                headers=self._headers(run_id),
                data=Body(pack_batch_parts(rest[:count]), BATCH),
            )
            message_ids += bodies.texts(bodies.fields(loads(body), "an answer"), "message_ids")
            rest = rest[count:]
            if not rest:
                return message_ids

    async def pull_replies(
        self, run_id: int, message_ids: Sequence[str] | None, *, wait_seconds: float = 0.0
    ) -> list[Message]:
        asked = None if message_ids is None else list(message_ids)
        request = {"message_ids": asked, "wait_seconds": wait_seconds}
        body = await self._session.fetch_payload(
            "POST",
            "/v1/runtime/replies/pull",
            headers={**self._headers(run_id), "Content-Type": JSON},
            data=dumps(request),
            timeout=self._session.timeouts(wait_seconds),
            cap=self._max_body,
        )
        return await decoded(partial(unpack_batch, limits=self._limits), body)

    async def ack_replies(self, run_id: int, message_ids: Sequence[str]) -> None:
        await self._call("POST", "/v1/runtime/replies/ack", run_id, {"message_ids": [*message_ids]})

    async def save_context(self, run_id: int, state: RecordDict) -> None:
        await self._session.call(
            "PUT",
            "/v1/runtime/context",
            headers=self._headers(run_id),
            data=Body(pack_recorddict_parts(state), RECORDDICT),
        )

    async def load_context(self, run_id: int) -> RecordDict:
        body = await self._session.fetch_payload(
            "GET", "/v1/runtime/context", headers=self._headers(run_id), cap=self._max_body
        )
        return await decoded(partial(unpack_recorddict, limits=self._limits), body)

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> None:
        document = {"lines": list(lines), "batch": batch}
        await self._call("POST", "/v1/runtime/logs", run_id, document)

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> None:
        document = {"documents": list(documents), "batch": batch}
        await self._call("POST", "/v1/runtime/metrics", run_id, document)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        await self._session.call(
            "PUT",
            f"/v1/runtime/artifacts/{quote(name, safe='')}",
            headers=self._headers(run_id),
            data=Body(pack_recorddict_parts(content), RECORDDICT),
        )

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        body = await self._session.fetch_payload(
            "GET",
            f"/v1/runtime/artifacts/{quote(name, safe='')}",
            headers=self._headers(run_id),
            cap=self._max_body,
        )
        return await decoded(partial(unpack_recorddict, limits=self._limits), body)

    async def finish(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        request = {"status": RunStatus(status).value, "reason": reason}
        body = await self._call("POST", "/v1/runtime/finish", run_id, request)
        return bodies.run_from_json(loads(body))

    def _headers(self, run_id: int, secret: str | None = None) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._secret if secret is None else secret}",
            RUN_HEADER: bodies.id_to_json(run_id),
        }

    async def _call(
        self,
        method: str,
        path: str,
        run_id: int,
        request: Mapping[str, Any] | None = None,
        *,
        secret: str | None = None,
    ) -> bytes:
        """Call with a JSON request, if any; the answer's body."""
        headers = self._headers(run_id, secret)
        if request is not None:
            headers["Content-Type"] = JSON
        data = None if request is None else dumps(request)
        return await self._session.call(method, path, headers=headers, data=data)


def _limits(max_body: int, max_value_len: int) -> DecodeLimits:
    """What either end of the runtime API decodes within."""
    return DecodeLimits(
        max_bytes=max_body, max_value_len=max_value_len, max_objects=MAX_RUN_OBJECTS
    )
