"""What a stranger may cost the fleet API: connections, their idleness, and request rates.

grpclib keeps every accepted connection for as long as its peer holds it open, idle
or half-open, with no limit: 300 idle sockets once used up a link's 256 file
descriptors, and registration and ``fedcore ls`` stopped. :class:`GuardedServer`
is grpclib's server with a protocol that

- counts connections per peer address and refuses (closes at once) one over
  :attr:`FleetLimits.connections_per_peer`;
- keeps the total under :attr:`FleetLimits.max_connections` (and under what the
  process's file-descriptor limit leaves to spare): at the cap, a new connection
  evicts the one idle the longest, so strangers holding sockets open cannot lock a
  real node out; with none idle, the new one is refused;
- closes a connection with no call in progress that received nothing for
  :attr:`FleetLimits.idle_timeout` seconds, and turns on TCP keepalive, so that a
  peer that vanished mid-call (half-open) is found by the kernel.

:class:`Rates` is a token bucket per key that the handlers consult: per peer
address before each call, per node key once the call's signature is checked, and
per peer address and over all peers before each registration. A refusal says how
long until the bucket holds a token again (the call's retry hint). :class:`FloodLog`
logs each kind of refusal once per interval with a count, instead of a line (or a
traceback) per request.

The protocol subclasses grpclib's ``H2Protocol`` and reads its ``processor.streams``
(the calls open on the connection), private parts of grpclib 0.4 (pinned <0.5).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, cast

import grpclib.server
from grpclib.protocol import H2Protocol

log = logging.getLogger(__name__)

FD_RESERVE = 64
"""File descriptors kept free of fleet connections: the control API, the database and
its journal, ServerApp pipes and logs need them."""


@dataclass(frozen=True, slots=True)
class FleetLimits:
    """The bounds the fleet API keeps on every peer (``fedcore serve --role link`` flags).

    The defaults let a thousand nodes share one address (behind NAT) with room to spare.
    """

    idle_timeout: float = 300.0
    """Seconds a connection with no call in progress may stay silent before it is closed."""
    body_timeout: float = 60.0
    """Seconds one request frame may take to arrive once its call has begun."""
    connections_per_peer: int = 2048
    max_connections: int = 8192
    """All connections at once; also kept :data:`FD_RESERVE` under the fd limit."""
    requests_per_second: float = 2000.0
    """Calls per second one peer address may start, on average."""
    request_burst: int = 4000
    """Calls one peer address may start at once, above its rate (the CLI: twice the rate)."""
    requests_per_second_per_key: float = 100.0
    """Calls one node key may make per second, on average, once its signature is checked:
    a node heartbeats every few seconds and makes a handful of calls per message, so a
    key over this is a registered node flooding the link, whatever its address."""
    request_burst_per_key: int = 200
    registrations_per_second: float = 10.0
    """Registrations one peer address may make per second, on average, after a burst of
    :attr:`registration_burst`: each new key costs the link a row and a log line."""
    registration_burst: int = 1000
    """Registrations one peer address may make at once: a thousand nodes behind one NAT
    starting together."""
    registrations_per_second_total: float = 100.0
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

    def connection_cap(self) -> int:
        """:attr:`max_connections`, lowered to leave :data:`FD_RESERVE` descriptors free."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - FD_RESERVE))


DEFAULT_FLEET_LIMITS = FleetLimits()


class FloodLog:
    """Warnings about refusals, each kind at most once per ``interval`` seconds, counted."""

    def __init__(self, interval: float = 60.0, now: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._now = now
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``kind`` was logged within the interval; count it."""
        now = self._now()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        more = f" ({suppressed} more like it since the last warning)" if suppressed else ""
        log.warning(message + "%s", *args, more)


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


@dataclass
class _Registry:
    """The connections of one server, by peer address, for the limits and eviction."""

    limits: FleetLimits
    flood: FloodLog
    cap: int
    by_peer: dict[str, int] = field(default_factory=dict)
    open: set[_GuardedProtocol] = field(default_factory=set)


class _GuardedProtocol(H2Protocol):
    """grpclib's HTTP/2 protocol, counted per peer, closed when idle, refused over the caps."""

    def __init__(self, registry: _Registry, *args: Any) -> None:
        super().__init__(*args)
        self._registry = registry
        self._peer = ""
        self._transport: asyncio.Transport | None = None
        self._last_seen = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream server's transports are
        registry = self._registry
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if registry.by_peer.get(self._peer, 0) >= registry.limits.connections_per_peer:
            registry.flood.warn(
                "peer-connections",
                "refused a fleet connection from %s: it holds %d, the most one peer may",
                self._peer,
                registry.limits.connections_per_peer,
            )
            self.handler.close()  # so that grpclib's server forgets it
            transport.abort()
            return
        if len(registry.open) >= registry.cap and not self._evict_idlest():
            registry.flood.warn(
                "connections",
                "refused a fleet connection from %s: %d are open, none idle",
                self._peer,
                len(registry.open),
            )
            self.handler.close()  # so that grpclib's server forgets it
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _keepalive(sock)
        super().connection_made(transport)
        self._transport = transport
        registry.by_peer[self._peer] = registry.by_peer.get(self._peer, 0) + 1
        registry.open.add(self)
        self._last_seen = asyncio.get_running_loop().time()
        self._arm(registry.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return  # refused: closing
        self._last_seen = asyncio.get_running_loop().time()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._transport is None:
            return  # refused before grpclib saw it
        self._transport = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        registry = self._registry
        registry.open.discard(self)
        left = registry.by_peer.get(self._peer, 1) - 1
        if left:
            registry.by_peer[self._peer] = left
        else:
            registry.by_peer.pop(self._peer, None)
        super().connection_lost(exc)

    def _busy(self) -> bool:
        return bool(self.processor.streams)

    def _idle_for(self, now: float) -> float:
        return 0.0 if self._busy() else now - self._last_seen

    def _arm(self, delay: float) -> None:
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        if self._transport is None:
            return
        now = asyncio.get_running_loop().time()
        timeout = self._registry.limits.idle_timeout
        if self._busy():
            self._last_seen = now  # a call in progress is not idleness
        idle = now - self._last_seen
        if idle >= timeout:
            self._registry.flood.warn(
                "idle", "closed a fleet connection from %s idle for %.0f s", self._peer, idle
            )
            self._close()
            return
        self._arm(timeout - idle)

    def _evict_idlest(self) -> bool:
        """Close the connection idle the longest to make room; False if none is idle."""
        now = asyncio.get_running_loop().time()
        idlest = max(self._registry.open, key=lambda c: c._idle_for(now), default=None)
        if idlest is None or idlest._busy():
            return False
        self._registry.flood.warn(
            "evicted",
            "the fleet API is at its %d connections: closed the idlest, from %s",
            self._registry.cap,
            idlest._peer,
        )
        idlest._close()
        return True

    def _close(self) -> None:
        transport = self._transport
        if transport is not None:
            self.connection_lost(None)
            transport.abort()


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive: a peer that vanished is found in about two minutes, even mid-call."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class GuardedServer(grpclib.server.Server):
    """grpclib's server, its connections kept within ``limits`` (see the module)."""

    def __init__(self, handlers: Any, *, limits: FleetLimits, flood: FloodLog, **kwargs: Any):
        super().__init__(handlers, **kwargs)
        self._registry = _Registry(limits, flood, limits.connection_cap())

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._registry.open)

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        return _GuardedProtocol(
            self._registry, protocol.handler, protocol.config, protocol.h2_config
        )
