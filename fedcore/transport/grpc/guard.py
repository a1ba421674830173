"""What a stranger may cost the fleet API: connections, their idleness, and request rates.

:class:`GuardedServer` is grpclib's server with a protocol that reports each
connection to a :class:`~fedcore.transport.connections.ConnectionGuard`, the bound
every listener keeps: per-peer and total caps (at the cap a new connection evicts the
one idle the longest), and a deadline: a connection with no call in progress that
received nothing for :attr:`FleetLimits.idle_timeout` seconds is closed.

:class:`Rates` is a token bucket per key that the handlers consult: per peer
address before each call, per node key once the call's signature is checked, and
per peer address and over all peers before each registration. A refusal says how
long until the bucket holds a token again (the call's retry hint). Refusals are
logged once per interval with a count (:class:`~fedcore.transport.connections.FloodLog`).

The protocol subclasses grpclib's ``H2Protocol`` and reads its ``processor.streams``
(the calls open on the connection), private parts of grpclib 0.4 (pinned <0.5).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, cast

import grpclib.server
from grpclib.protocol import H2Protocol

from fedcore.defaults import (
    FLEET_BODY_TIMEOUT,
    FLEET_CONNECTIONS_PER_PEER,
    FLEET_IDLE_TIMEOUT,
    FLEET_MAX_CONNECTIONS,
    FLEET_REGISTRATION_BURST,
    FLEET_REGISTRATIONS_PER_SECOND,
    FLEET_REGISTRATIONS_PER_SECOND_TOTAL,
    FLEET_REQUESTS_PER_SECOND,
    FLEET_REQUESTS_PER_SECOND_PER_KEY,
)
from fedcore.transport.connections import ConnectionGuard, FloodLog


@dataclass(frozen=True, slots=True)
class FleetLimits:
    """The bounds the fleet API keeps on every peer (``fedcore serve --role link`` flags).

    The defaults let a thousand nodes share one address (behind NAT) with room to spare.
    """

    idle_timeout: float = FLEET_IDLE_TIMEOUT
    """Seconds a connection with no call in progress may stay silent before it is closed."""
    body_timeout: float = FLEET_BODY_TIMEOUT
    """Seconds one request frame may take to arrive once its call has begun."""
    connections_per_peer: int = FLEET_CONNECTIONS_PER_PEER
    max_connections: int = FLEET_MAX_CONNECTIONS
    """All connections at once (and all listeners' together are kept
    :data:`~fedcore.transport.connections.FD_RESERVE` under the fd limit)."""
    requests_per_second: float = FLEET_REQUESTS_PER_SECOND
    """Calls per second one peer address may start, on average."""
    request_burst: int = 4000
    """Calls one peer address may start at once, above its rate (the CLI: twice the rate)."""
    requests_per_second_per_key: float = FLEET_REQUESTS_PER_SECOND_PER_KEY
    """Calls one node key may make per second, on average, once its signature is checked:
    a node heartbeats every few seconds and makes a handful of calls per message, so a
    key over this is a registered node flooding the link, whatever its address."""
    request_burst_per_key: int = 200
    registrations_per_second: float = FLEET_REGISTRATIONS_PER_SECOND
    """Registrations one peer address may make per second, on average, after a burst of
    :attr:`registration_burst`: each new key costs the link a row and a log line."""
    registration_burst: int = FLEET_REGISTRATION_BURST
    """Registrations one peer address may make at once: a thousand nodes behind one NAT
    starting together."""
    registrations_per_second_total: float = FLEET_REGISTRATIONS_PER_SECOND_TOTAL
    """Registrations per second over all peer addresses, on average."""
    registration_burst_total: int = 2000

    def __post_init__(self) -> None:
        for name in (
            "idle_timeout",
            "body_timeout",
            "requests_per_second",
            "requests_per_second_per_key",
            "registrations_per_second",
            "registrations_per_second_total",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"FleetLimits.{name} must be positive, got {value!r}")
        for name in (
            "connections_per_peer",
            "max_connections",
            "request_burst",
            "request_burst_per_key",
            "registration_burst",
            "registration_burst_total",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"FleetLimits.{name} must be a positive int, got {value!r}")


DEFAULT_FLEET_LIMITS = FleetLimits()


class Rates:
    """A token bucket per key (a peer address, a node key): :meth:`admit` says whether a
    call may start, and if not, in how many seconds it could."""

    MAX_BUCKETS = 65536
    """Buckets kept before the full ones (which hold no state) are forgotten."""

    def __init__(self, rate: float, burst: int, now: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._now = now
        self._buckets: dict[Hashable, tuple[float, float]] = {}

    def admit(self, key: Hashable) -> float:
        """0.0 if ``key`` may make a call now (it spends a token); otherwise the seconds
        until it may (it spends nothing)."""
        now = self._now()
        tokens, then = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - then) * self._rate)
        if len(self._buckets) > self.MAX_BUCKETS:
            self._buckets = {k: b for k, b in self._buckets.items() if b[0] < self._burst}
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self._rate
        self._buckets[key] = (tokens - 1.0, now)
        return 0.0

    def give_back(self, key: Hashable) -> None:
        """Return the token ``key`` spent on a call another bucket then refused."""
        tokens, then = self._buckets.get(key, (self._burst, self._now()))
        self._buckets[key] = (min(self._burst, tokens + 1.0), then)


class _GuardedProtocol(H2Protocol):
    """grpclib's HTTP/2 protocol, counted by its guard, closed when idle, refused over the caps."""

    def __init__(self, guard: ConnectionGuard, idle_timeout: float, *args: Any) -> None:
        super().__init__(*args)
        self._guard = guard
        self._idle_timeout = idle_timeout
        self._transport: asyncio.Transport | None = None
        self._last_seen = 0.0

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream server's transports are
        self._last_seen = asyncio.get_running_loop().time()
        if not self._guard.admit(self, transport):
            self.handler.close()  # so that grpclib's server forgets it
            transport.abort()
            return
        super().connection_made(transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return  # refused: closing
        self._last_seen = asyncio.get_running_loop().time()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._transport is None:
            return  # refused before grpclib saw it, or aborted
        self._transport = None
        self._guard.forget(self)
        super().connection_lost(exc)

    def busy(self) -> bool:
        # grpclib's processor exists once the guard has admitted the connection
        return self._transport is not None and bool(self.processor.streams)

    def idle_since(self) -> float:
        return self._last_seen

    def deadline(self, now: float) -> tuple[float, str]:
        if self.busy():
            self._last_seen = now  # a call in progress is not idleness
        return self._last_seen + self._idle_timeout, f"idle for {self._idle_timeout:g} s"

    def abort(self) -> None:
        transport = self._transport
        if transport is not None:
            self.connection_lost(None)
            transport.abort()


class GuardedServer(grpclib.server.Server):
    """grpclib's server, its connections kept within ``limits`` (see the module)."""

    def __init__(self, handlers: Any, *, limits: FleetLimits, flood: FloodLog, **kwargs: Any):
        super().__init__(handlers, **kwargs)
        self._idle_timeout = limits.idle_timeout
        self._guard = ConnectionGuard(
            "fleet",
            max_connections=limits.max_connections,
            connections_per_peer=limits.connections_per_peer,
            flood=flood,
        )

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return self._guard.connections

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        return _GuardedProtocol(
            self._guard, self._idle_timeout, protocol.handler, protocol.config, protocol.h2_config
        )
