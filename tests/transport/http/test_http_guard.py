"""What serve_http's guard closes, and what it leaves alone: its caps and deadlines in process.

The deadlines against half-sent requests are tested on a real link
(``tests/deployment/test_http_slowloris.py``); here, that a request being handled is
never cut however long it takes, and how the caps refuse and evict.
"""

from __future__ import annotations

import anyio
import pytest
from aiohttp import web
from anyio.abc import SocketStream

from fedcore.transport.http import serve_http
from fedcore.transport.http.guard import HttpLimits

pytestmark = pytest.mark.anyio

SHORT = 0.3
"""Every timeout of the guard, in seconds: a handler below takes several times that."""


async def _slow(request: web.Request) -> web.Response:
    body = await request.read()
    await anyio.sleep(4 * SHORT)
    return web.Response(body=body)


def _app() -> web.Application:
    app = web.Application()
    app.router.add_post("/slow", _slow)
    app.router.add_get("/quick", _quick)
    return app


async def _quick(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _answer(stream: SocketStream) -> bytes:
    """One whole answer with a Content-Length (the test's own are short)."""
    answer = b""
    with anyio.fail_after(10):
        while b"\r\n\r\n" not in answer or not answer.endswith((b"abc", b"ok")):
            answer += await stream.receive()
    return answer


async def _closed(stream: SocketStream) -> bool:
    """Whether the server closed ``stream`` (within a few timeouts)."""
    with anyio.move_on_after(10 * SHORT):
        try:
            await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            return True
    return False


async def test_a_request_being_handled_is_never_cut_and_its_connection_is_reused() -> None:
    limits = HttpLimits(header_timeout=SHORT, body_timeout=SHORT, idle_timeout=SHORT)
    async with (
        serve_http(_app(), limits=limits) as port,
        await anyio.connect_tcp("127.0.0.1", port) as stream,
    ):
        await stream.send(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        await stream.send(b"GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        assert await _closed(stream)  # then idle: closed


async def test_over_the_per_peer_cap_is_refused_and_at_the_cap_the_idlest_goes() -> None:
    per_peer = HttpLimits(connections_per_peer=2, idle_timeout=60.0)
    async with serve_http(_app(), limits=per_peer) as port:
        first = await anyio.connect_tcp("127.0.0.1", port)
        second = await anyio.connect_tcp("127.0.0.1", port)
        async with first, second, await anyio.connect_tcp("127.0.0.1", port) as third:
            assert await _closed(third)
            await first.send(b"GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _answer(first)).startswith(b"HTTP/1.1 200")
    capped = HttpLimits(max_connections=2, idle_timeout=60.0)
    async with serve_http(_app(), limits=capped) as port:
        idlest = await anyio.connect_tcp("127.0.0.1", port)
        await anyio.sleep(SHORT)  # so that it is the idlest
        second = await anyio.connect_tcp("127.0.0.1", port)
        async with idlest, second, await anyio.connect_tcp("127.0.0.1", port) as third:
            await third.send(b"GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _answer(third)).startswith(b"HTTP/1.1 200")
            assert await _closed(idlest)
