"""What a stranger may cost an HTTP API: connections, and how long a request may take to arrive.

aiohttp reads a request's headers and body for as long as the peer takes: 200
requests sent half-way stayed open for minutes, and 1,000 of them used up a link's
file descriptors (slowloris). :func:`guarded_protocols` wraps aiohttp's protocol
factory so that each connection reports to a
:class:`~fedcore.transport.connections.ConnectionGuard`, as the fleet API's do: the
same per-peer and total caps (at the cap a new connection evicts the one idle the
longest), and deadlines by what the connection is doing:

- between requests, nothing received: closed after :attr:`HttpLimits.idle_timeout`;
- a request begun (a byte of it arrived) whose headers are not all in within
  :attr:`HttpLimits.header_timeout` of its first byte: closed;
- a request being handled whose body is not all in within
  :attr:`HttpLimits.body_timeout` of its headers: closed.

A request whose body is in may be handled as long as its handler takes (a followed
log, a long pull of replies). :data:`track_requests`, a middleware, tells each
connection when a request is being handled. Only aiohttp's public parts are used:
the wrapper is an asyncio protocol around the one aiohttp makes, and the middleware
finds it as its transport's protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Handler

from fedcore.defaults import (
    HTTP_BODY_TIMEOUT,
    HTTP_CONNECTIONS_PER_PEER,
    HTTP_HEADER_TIMEOUT,
    HTTP_IDLE_TIMEOUT,
    HTTP_MAX_CONNECTIONS,
)
from fedcore.transport.connections import ConnectionGuard


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The bounds each HTTP API of a link keeps on every peer (``fedcore serve`` flags).

    The idle timeout is longer than the 15 s aiohttp's clients keep an idle
    connection, so that a client never reuses one the server is closing.
    """

    header_timeout: float = HTTP_HEADER_TIMEOUT
    """Seconds a request's headers may take to arrive, from its first byte."""
    body_timeout: float = HTTP_BODY_TIMEOUT
    """Seconds a request's body may take to arrive, from the end of its headers."""
    idle_timeout: float = HTTP_IDLE_TIMEOUT
    """Seconds a connection between requests may stay silent before it is closed."""
    connections_per_peer: int = HTTP_CONNECTIONS_PER_PEER
    """Connections one peer address may hold open; more are refused on arrival."""
    max_connections: int = HTTP_MAX_CONNECTIONS
    """All connections of one API at once (and all listeners' together are kept
    :data:`~fedcore.transport.connections.FD_RESERVE` under the fd limit)."""

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "idle_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"HttpLimits.{name} must be positive, got {value!r}")
        for name in ("connections_per_peer", "max_connections"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"HttpLimits.{name} must be a positive int, got {value!r}")


DEFAULT_HTTP_LIMITS = HttpLimits()


def guarded_protocols(
    make: Callable[[], asyncio.Protocol], guard: ConnectionGuard, limits: HttpLimits
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for ``loop.create_server``: ``make``'s protocols, guarded."""
    return lambda: _GuardedConnection(make, guard, limits)


@web.middleware
async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the request's connection that it is being handled, until its handler returns."""
    transport = request.transport
    connection = transport.get_protocol() if transport is not None else None
    if not isinstance(connection, _GuardedConnection):
        return await handler(request)
    connection.handling(request)
    try:
        return await handler(request)
    finally:
        connection.handled()


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, made only once the guard admits it."""

    def __init__(
        self, make: Callable[[], asyncio.Protocol], guard: ConnectionGuard, limits: HttpLimits
    ) -> None:
        self._make = make
        self._guard = guard
        self._limits = limits
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._last_seen = 0.0
        self._begun: float | None = None
        """When the first byte of a request not yet handled arrived."""
        self._request: web.BaseRequest | None = None
        self._handled_since = 0.0

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream server's transports are
        self._last_seen = asyncio.get_running_loop().time()
        if not self._guard.admit(self, transport):
            transport.abort()
            return
        self._transport = transport
        self._inner = self._make()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return  # refused or aborted: closing
        self._last_seen = asyncio.get_running_loop().time()
        if self._request is None and self._begun is None and data:
            self._begun = self._last_seen
            self._guard.rearm(self)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None
        if inner is None:
            return  # refused before aiohttp saw it, or aborted
        self._transport = None
        self._guard.forget(self)
        inner.connection_lost(exc)

    def handling(self, request: web.BaseRequest) -> None:
        """``request``'s headers are in and its handler has begun."""
        self._request = request
        self._begun = None
        self._handled_since = asyncio.get_running_loop().time()
        self._guard.rearm(self)

    def handled(self) -> None:
        """The handler of the request has returned: the connection is between requests."""
        self._request = None
        self._last_seen = asyncio.get_running_loop().time()
        self._guard.rearm(self)

    def busy(self) -> bool:
        return self._request is not None

    def idle_since(self) -> float:
        return self._last_seen

    def deadline(self, now: float) -> tuple[float, str]:
        limits = self._limits
        if self._request is not None:
            if not self._request.content.is_eof():
                return (
                    self._handled_since + limits.body_timeout,
                    f"a request's body not in within {limits.body_timeout:g} s",
                )
            return now + limits.idle_timeout, "handled"  # as long as its handler takes
        if self._begun is not None:
            return (
                self._begun + limits.header_timeout,
                f"a request's headers not in within {limits.header_timeout:g} s",
            )
        return self._last_seen + limits.idle_timeout, f"idle for {limits.idle_timeout:g} s"

    def abort(self) -> None:
        transport = self._transport
        if transport is not None:
            self.connection_lost(None)
            transport.abort()
