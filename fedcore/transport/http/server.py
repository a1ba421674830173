"""Serving an aiohttp application, and what every handler of fedcore's HTTP APIs shares.

:func:`serve_http` binds a socket (port 0 picks a free one), serves an application
on it and reports the bound port, as :func:`~fedcore.transport.grpc.serve_fleet`
does for the fleet API. It configures aiohttp for untrusted peers: bodies are not
decompressed (a gzip bomb stays a small body), a handler is cancelled when its
client goes away, so that a long wait (a followed log, a reply pull) does not hold
on to the service for nobody, and a request aiohttp's parser refuses (a header line
too long, too many headers, not HTTP) is answered 400 with one debug line, not the
traceback aiohttp logs by default: a stranger sending those costs the log nothing.
Its connections are kept within :class:`~fedcore.transport.http.guard.HttpLimits`
(:mod:`fedcore.transport.http.guard`): caps, and deadlines for a request's headers
and body, so that requests sent half-way (slowloris) cannot hold the API.

:func:`guarded` wraps each handler: fedcore's errors become answers by the table in
:mod:`fedcore.transport.http.errors`; anything unexpected is logged here and answered
500 with no detail. :func:`request_body` reads a body under a cap and refuses a larger
one with 413 before buffering it: at once when the declared length is over, else as
soon as the bytes received pass the cap.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from fedcore.errors import DecodeError, FedcoreError
from fedcore.transport.connections import ConnectionGuard, FloodLog
from fedcore.transport.http.bodies import WRITE_SLICE, read_at_most, read_payload
from fedcore.transport.http.errors import (
    error_response,
    expected_error,
    internal_error,
    too_large,
)
from fedcore.transport.http.guard import (
    DEFAULT_HTTP_LIMITS,
    HttpLimits,
    guarded_protocols,
    track_requests,
)
from fedcore.wire import Parts, parts_size
from fedcore.wire.frame import Buffer, slices
from fedcore.wire.spool import SPOOL_THRESHOLD

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
R = TypeVar("R")
SHUTDOWN_SECONDS = 5.0
"""How long a stopping server lets the requests in progress finish before cancelling them."""


@asynccontextmanager
async def serve_http(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    name: str = "HTTP",
    ssl: _ssl.SSLContext | None = None,
    shutdown_seconds: float = SHUTDOWN_SECONDS,
    limits: HttpLimits = DEFAULT_HTTP_LIMITS,
) -> AsyncIterator[int]:
    """Serve ``app`` on ``host:port`` until the block ends; yield the bound port.

    ``name`` says which API this is in the log lines. ``limits`` bound its
    connections and how long a request may take to arrive. Leaving the block stops
    accepting connections, gives the requests in progress ``shutdown_seconds`` to
    finish, then cancels them.
    """
    app.middlewares.insert(0, track_requests)
    # No access log: the runtime API answers several requests per round per run, and
    # a line for each would drown what a person needs to read.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=shutdown_seconds,
        auto_decompress=False,
        access_log=None,
        logger=_PeerFaults(logging.getLogger("aiohttp.server")),
    )
    await runner.setup()
    server: asyncio.Server | None = None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=1024)
        guard = ConnectionGuard(
            name,
            max_connections=limits.max_connections,
            connections_per_peer=limits.connections_per_peer,
            flood=FloodLog(),
        )
        assert runner.server is not None  # set up above
        try:
            server = await asyncio.get_running_loop().create_server(
                guarded_protocols(runner.server, guard, limits),
                sock=sock,
                ssl=ssl,
                ssl_handshake_timeout=limits.header_timeout if ssl is not None else None,
                backlog=1024,
            )
        except BaseException:
            sock.close()
            raise
        bound: int = sock.getsockname()[1]
        log.info("%s API listening on %s:%d", name, host, bound)
        yield bound
    finally:
        if server is not None:
            server.close()  # stop accepting; the runner ends the connections
        await runner.cleanup()


class _PeerFaults(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, with a request its parser refused kept to one debug line.

    aiohttp logs such a request with ``exception`` (a traceback each); it is the
    peer's fault, not the server's, and anyone can send any number of them. The line
    names the kind of fault only, never the peer's bytes.
    """

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        fault = kwargs.get("exc_info")
        if not isinstance(fault, BaseException):
            fault = sys.exc_info()[1]
        if isinstance(fault, HttpProcessingError):
            kind = type(fault).__name__
            self.debug("refused a malformed request (%s, HTTP %d)", kind, fault.code)
            return
        super().exception(msg, *args, **kwargs)


def guarded(
    handler: Callable[[web.Request], Awaitable[R]],
) -> Callable[[web.Request], Awaitable[R | web.Response]]:
    """``handler`` with fedcore's errors as answers, and nothing unexpected leaking."""

    async def guarded_handler(request: web.Request) -> R | web.Response:
        try:
            return await handler(request)
        except web.HTTPException:
            raise  # an answer already: a refused body, a missing token
        except (FedcoreError, ValueError) as exc:
            answer = expected_error(exc)
            if answer is not None:
                return error_response(*answer)
            log.exception("%s %s failed", request.method, request.path)
        except ConnectionError:
            raise  # the client went away while being answered: aiohttp drops the connection
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
        return internal_error()

    return guarded_handler


async def request_body(request: web.Request, cap: int, too_large_kind: type[FedcoreError]) -> bytes:
    """The request's body, at most ``cap`` bytes; over it, 413 naming ``too_large_kind``.

    A compressed body (``Content-Encoding``) is refused: nothing fedcore sends is
    compressed, and decompressing would let a small body grow past any cap.
    """
    _refuse_declared(request, cap, too_large_kind)
    data = await read_at_most(request.content, cap)
    _refuse_read(data, cap, too_large_kind)
    return data


async def request_payload(
    request: web.Request, cap: int, too_large_kind: type[FedcoreError]
) -> Buffer:
    """As :func:`request_body`, for a payload: a large one is spooled, not held in memory."""
    _refuse_declared(request, cap, too_large_kind)
    data = await read_payload(request.content, cap)
    _refuse_read(data, cap, too_large_kind)
    return data


def _refuse_declared(request: web.Request, cap: int, too_large_kind: type[FedcoreError]) -> None:
    refuse_compressed(request)
    declared = request.content_length
    if declared is not None and declared > cap:
        raise too_large(too_large_kind, f"a body of {declared} bytes is over the cap of {cap}")


def _refuse_read(data: Buffer, cap: int, too_large_kind: type[FedcoreError]) -> None:
    if len(data) > cap:
        raise too_large(too_large_kind, f"the body is over the cap of {cap} bytes")


async def payload_response(
    request: web.Request, parts: Parts, content_type: str
) -> web.StreamResponse:
    """An answer whose body is ``parts``, written a slice at a time, never joined.

    A pull of replies answers with their models: joined into one ``bytes``, they
    would cost the link their size again for as long as the answer takes to send.
    """
    size = parts_size(parts)
    if size <= SPOOL_THRESHOLD:  # small: one write costs less than streaming
        return web.Response(body=b"".join(parts), content_type=content_type)
    response = web.StreamResponse()
    response.content_type = content_type
    response.content_length = size
    await response.prepare(request)
    for piece in slices(parts, WRITE_SLICE):
        await response.write(piece)
    await response.write_eof()
    return response


def refuse_compressed(request: web.BaseRequest) -> None:
    """Refuse a compressed body: it could decompress past any cap."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if encoding != "identity":
        raise DecodeError(f"compressed bodies ({encoding[:20]}) are not accepted")
