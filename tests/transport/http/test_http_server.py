"""What serve_http logs: a peer's malformed request as one debug line, a server fault in full."""

from __future__ import annotations

import logging

import anyio
import pytest
from aiohttp import web

from fedcore.transport.http import serve_http

pytestmark = pytest.mark.anyio


async def _fails(request: web.Request) -> web.Response:
    raise RuntimeError("a bug in a handler")


async def _status_line(port: int, request: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        answer = b""
        with anyio.fail_after(10):
            while b"\r\n" not in answer:
                answer += await stream.receive()
    return answer.partition(b"\r\n")[0]


async def test_a_malformed_request_is_one_debug_line_and_a_fault_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = web.Application()
    app.router.add_get("/fails", _fails)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with serve_http(app) as port:
        long_line = b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n"
        assert (await _status_line(port, long_line)).split(b" ")[1] == b"400"
        refused = [r for r in caplog.records if r.name == "aiohttp.server"]
        assert [(r.levelno, r.getMessage(), r.exc_info) for r in refused] == [
            (logging.DEBUG, "refused a malformed request (LineTooLong, HTTP 400)", None)
        ]
        caplog.clear()
        fault = b"GET /fails HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert (await _status_line(port, fault)).split(b" ")[1] == b"500"
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert errors[0].exc_info is not None
        assert isinstance(errors[0].exc_info[1], RuntimeError)
