"""The exec API over HTTP: what an exec started on its own asks of the link.

:func:`exec_app` serves any :class:`~fedcore.transport.exec.ExecService`;
:class:`HttpExecClient` is one, remotely. Every request is signed with the secret
the exec shares with the link, for the link's name (:mod:`fedcore.auth.exec_signatures`);
a request without a valid signature is answered 401 before its handler runs,
whatever was wrong with it — the refusal of one signed for another link's name (or
this link's before a restart) carries the link's name in ``X-Fedcore-Link``, and the
client signs it again for that name. Bodies are small JSON
(:mod:`fedcore.transport.http.bodies`; run ids and tokens are decimal strings),
except a bundle, which comes as it is stored. The routes::

    GET  /v1/exec/link                  -> {"runtime_address": "127.0.0.1:4242"}
    POST /v1/exec/claims                {"limit": n, "lease": s, "wait_seconds": s}
                                        -> {"claims": [{"run", "token", "secret",
                                                        "attempt", "expires_at"}, ...]}
    GET  /v1/exec/runs/{run_id}         -> the run
    POST /v1/exec/runs/{run_id}/renew   {"token": "7", "lease": s} -> {"expires_at": t}
    POST /v1/exec/runs/{run_id}/start   {"token": "7", "heartbeat_interval": s} -> the run
    POST /v1/exec/runs/{run_id}/fail    {"token": "7", "reason": "..."} -> the run
    POST /v1/exec/runs/{run_id}/wait    {"wait_seconds": s} -> the run, once finished
                                        or when the wait is over
    POST /v1/exec/runs/{run_id}/logs    {"lines": ["...", ...]} -> 204
    GET  /v1/exec/bundles/{sha256}      -> application/zip, the bundle

An answer carries a claim's launch secret, so the API must not be readable by
others: on loopback, or behind TLS (:func:`~fedcore.runtime.addresses.check_exposure`).
Waits (``wait_seconds``) happen in the service; the client's timeout for such a call
is the wait plus its own.
"""

from __future__ import annotations

import logging
import ssl as _ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from aiohttp import web

from fedcore.apps.bundle import MAX_BUNDLE_BYTES
from fedcore.auth.admission import Arrival, admit
from fedcore.auth.exec_signatures import LINK, MAX_SKEW, Signer, Verifier
from fedcore.clock import Clock, SystemClock
from fedcore.domain import Run
from fedcore.errors import AuthenticationError, DecodeError, WrongLinkError
from fedcore.state.base import RunClaim
from fedcore.transport.exec import ExecService
from fedcore.transport.http import bodies
from fedcore.transport.http.bodies import JSON, dumps, loads
from fedcore.transport.http.errors import error_document
from fedcore.transport.http.server import Handler, guarded, request_body
from fedcore.transport.http.session import TIMEOUT, Session, SessionClient

__all__ = ["HttpExecClient", "exec_app"]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
"""The largest request body the exec API reads (it is read before its signature is checked)."""
ZIP = "application/zip"

_ExecHandler = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


def exec_app(
    service: ExecService,
    secret: str,
    *,
    clock: Clock | None = None,
    max_skew: float = MAX_SKEW,
    link: str | None = None,
) -> web.Application:
    """An aiohttp application serving ``service`` as the exec API to holders of ``secret``.

    A request's timestamp may differ from ``clock`` by ``max_skew`` seconds at most; it
    must be signed for the link named ``link`` (default: a new name).
    """
    verifier = Verifier(secret, clock or SystemClock(), max_skew=max_skew, link=link)
    handlers = _ExecHandlers(service, verifier)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    routes, route = app.router, handlers.route
    routes.add_get("/v1/exec/link", route(handlers.link), allow_head=False)
    routes.add_post("/v1/exec/claims", route(handlers.claim_runs))
    routes.add_get("/v1/exec/runs/{run_id}", route(handlers.get_run), allow_head=False)
    routes.add_post("/v1/exec/runs/{run_id}/renew", route(handlers.renew_claim))
    routes.add_post("/v1/exec/runs/{run_id}/start", route(handlers.start_run))
    routes.add_post("/v1/exec/runs/{run_id}/fail", route(handlers.fail_run))
    routes.add_post("/v1/exec/runs/{run_id}/wait", route(handlers.wait_finished))
    routes.add_post("/v1/exec/runs/{run_id}/logs", route(handlers.append_logs))
    routes.add_get("/v1/exec/bundles/{bundle_hash}", route(handlers.get_bundle), allow_head=False)
    return app


class _ExecHandlers:
    def __init__(self, service: ExecService, verifier: Verifier) -> None:
        self._service = service
        self._verifier = verifier

    def route(self, handler: _ExecHandler) -> Handler:
        async def signed(request: web.Request) -> web.StreamResponse:
            return await handler(request, await self._authenticate(request))

        return guarded(signed)

    async def _authenticate(self, request: web.Request) -> bytes:
        """The request's body, once its signature proved it comes from a holder of the secret.

        The headers (and the timestamp's freshness) are checked before any of the body
        is read; the body is read under a small cap, as it must be to be checked.
        """
        body = partial(request_body, request, MAX_REQUEST_BYTES, DecodeError)
        try:
            return await admit(
                self._verifier, Arrival(request.method, request.headers, body, request.raw_path)
            )
        except AuthenticationError as exc:
            raise _refused(request, exc) from None

    async def link(self, request: web.Request, body: bytes) -> web.StreamResponse:
        return _json({"runtime_address": await self._service.runtime_address()})

    async def claim_runs(self, request: web.Request, body: bytes) -> web.StreamResponse:
        document = _document(body)
        claims = await self._service.claim_runs(
            limit=bodies.count(document, "limit"),
            lease=bodies.seconds(document, "lease"),
            wait_seconds=bodies.seconds(document, "wait_seconds"),
        )
        return _json({"claims": [_claim_to_json(claim) for claim in claims]})

    async def get_run(self, request: web.Request, body: bytes) -> web.StreamResponse:
        return _run(await self._service.get_run(_run_id(request)))

    async def renew_claim(self, request: web.Request, body: bytes) -> web.StreamResponse:
        document = _document(body)
        expires_at = await self._service.renew_claim(
            _run_id(request), _token(document), lease=bodies.seconds(document, "lease")
        )
        return _json({"expires_at": expires_at})

    async def start_run(self, request: web.Request, body: bytes) -> web.StreamResponse:
        document = _document(body)
        interval = bodies.seconds(document, "heartbeat_interval")
        run = await self._service.start_run(
            _run_id(request), _token(document), heartbeat_interval=interval
        )
        return _run(run)

    async def fail_run(self, request: web.Request, body: bytes) -> web.StreamResponse:
        document = _document(body)
        reason = bodies.text(document, "reason")
        return _run(await self._service.fail_run(_run_id(request), _token(document), reason))

    async def wait_finished(self, request: web.Request, body: bytes) -> web.StreamResponse:
        wait = bodies.seconds(_document(body), "wait_seconds")
        return _run(await self._service.wait_finished(_run_id(request), wait_seconds=wait))

    async def append_logs(self, request: web.Request, body: bytes) -> web.StreamResponse:
        await self._service.append_logs(_run_id(request), bodies.texts(_document(body), "lines"))
        return web.Response(status=204)

    async def get_bundle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        bundle = await self._service.get_bundle(request.match_info["bundle_hash"])
        return web.Response(body=bundle, content_type=ZIP)


def _refused(request: web.Request, why: AuthenticationError) -> web.HTTPUnauthorized:
    """The one answer to a request that is not correctly signed; why goes to the log only,
    but for the link's name, which the refusal of one signed for another carries."""
    document = error_document(None, "a valid exec signature is required")
    headers = {LINK: why.link} if isinstance(why, WrongLinkError) else None
    if not (isinstance(why, WrongLinkError) and why.learning):
        log.warning("exec API: refused %s %s: %s", request.method, request.path, why)
    return web.HTTPUnauthorized(text=dumps(document).decode(), content_type=JSON, headers=headers)


def _document(body: bytes) -> dict[str, Any]:
    return bodies.fields(loads(body), "the request")


def _run_id(request: web.Request) -> int:
    return bodies.id_from_json(request.match_info["run_id"], "the run id")


def _token(document: Mapping[str, Any]) -> int:
    return bodies.id_from_json(document.get("token"), "'token'")


def _json(document: object) -> web.Response:
    return web.Response(body=dumps(document), content_type=JSON)


def _run(run: Run) -> web.Response:
    return _json(bodies.run_to_json(run))


def _claim_to_json(claim: RunClaim) -> dict[str, Any]:
    return {
        "run": bodies.run_to_json(claim.run),
        "token": bodies.id_to_json(claim.token),
        "secret": claim.secret,
        "attempt": claim.attempt,
        "expires_at": claim.expires_at,
    }


def _claim_from_json(document: object) -> RunClaim:
    doc = bodies.fields(document, "a claim")
    return RunClaim(
        run=bodies.run_from_json(doc.get("run")),
        token=_token(doc),
        secret=bodies.text(doc, "secret"),
        attempt=bodies.count(doc, "attempt"),
        expires_at=bodies.number(doc, "expires_at"),
    )


class HttpExecClient(SessionClient, ExecService):
    """The exec API of the link at ``host:port``, for an exec holding ``secret``.

    Use it as an async context manager. Each request is signed with ``secret`` and
    stamped with ``clock``'s time; ``timeout`` bounds each call beyond the wait it
    asks for.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: str,
        clock: Clock | None = None,
        ssl: _ssl.SSLContext | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self._session = Session(host, port, ssl=ssl, timeout=timeout, api="exec API")
        self._signer = Signer(secret, clock or SystemClock())

    async def runtime_address(self) -> str:
        document = bodies.fields(loads(await self._call("GET", "/v1/exec/link")), "an answer")
        return bodies.text(document, "runtime_address")

    async def claim_runs(
        self, *, limit: int, lease: float, wait_seconds: float = 0.0
    ) -> list[RunClaim]:
        request = {"limit": limit, "lease": lease, "wait_seconds": wait_seconds}
        body = await self._call("POST", "/v1/exec/claims", request, wait=wait_seconds)
        claims = bodies.fields(loads(body), "an answer").get("claims")
        if not isinstance(claims, list):
            bodies.invalid("'claims' must be a list")
        return [_claim_from_json(claim) for claim in claims]

    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        request = {"token": bodies.id_to_json(token), "lease": lease}
        body = await self._call("POST", f"{_path(run_id)}/renew", request)
        return bodies.number(bodies.fields(loads(body), "an answer"), "expires_at")

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        request = {"token": bodies.id_to_json(token), "heartbeat_interval": heartbeat_interval}
        return bodies.run_from_json(
            loads(await self._call("POST", f"{_path(run_id)}/start", request))
        )

    async def fail_run(self, run_id: int, token: int, reason: str) -> Run:
        request = {"token": bodies.id_to_json(token), "reason": reason}
        return bodies.run_from_json(
            loads(await self._call("POST", f"{_path(run_id)}/fail", request))
        )

    async def get_run(self, run_id: int) -> Run:
        return bodies.run_from_json(loads(await self._call("GET", _path(run_id))))

    async def wait_finished(self, run_id: int, *, wait_seconds: float) -> Run:
        request = {"wait_seconds": wait_seconds}
        body = await self._call("POST", f"{_path(run_id)}/wait", request, wait=wait_seconds)
        return bodies.run_from_json(loads(body))

    async def get_bundle(self, bundle_hash: str) -> bytes:
        if not bundle_hash.isascii() or not bundle_hash.isalnum():
            raise ValueError(f"not a bundle hash: {bundle_hash[:80]!r}")
        return await self._call("GET", f"/v1/exec/bundles/{bundle_hash}", cap=MAX_BUNDLE_BYTES)

    async def append_logs(self, run_id: int, lines: Sequence[str]) -> None:
        await self._call("POST", f"{_path(run_id)}/logs", {"lines": list(lines)})

    async def _call(
        self,
        method: str,
        path: str,
        request: Mapping[str, Any] | None = None,
        *,
        wait: float = 0.0,
        cap: int = bodies.MAX_JSON_BYTES,
    ) -> bytes:
        """A signed call with a JSON request, if any; the answer's body. A call refused as
        signed for another link's name (the exec's first, or its first after the link
        restarted) was refused before anything of it was read: it goes again at once,
        signed for the name the refusal told."""
        try:
            return await self._call_once(method, path, request, wait=wait, cap=cap)
        except WrongLinkError as refusal:
            if not self._signer.learn(refusal):
                raise
        return await self._call_once(method, path, request, wait=wait, cap=cap)

    async def _call_once(
        self,
        method: str,
        path: str,
        request: Mapping[str, Any] | None,
        *,
        wait: float,
        cap: int,
    ) -> bytes:
        body = b"" if request is None else dumps(request)
        headers = self._signer.headers(method, path, body)
        if request is not None:
            headers["Content-Type"] = JSON
        return await self._session.call(
            method,
            path,
            headers=headers,
            data=body if request is not None else None,
            timeout=self._session.timeouts(wait),
            cap=cap,
        )


def _path(run_id: int) -> str:
    return f"/v1/exec/runs/{bodies.id_to_json(run_id)}"
