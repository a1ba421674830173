"""What a stranger's connections may cost any listener of a role: count, idleness, deadlines.

An asyncio server keeps every accepted connection for as long as its peer holds it
open, idle, half-open or half-way through a request, with no limit: 300 idle sockets
once used up a link's 256 file descriptors on the fleet port, and 1,000 half-sent
requests did the same on the control port; registration and ``fedcore ls`` stopped.
:class:`ConnectionGuard` is the one bound every listener keeps (the fleet API's
grpclib protocol and the HTTP APIs' aiohttp protocol each report to one):

- it counts connections per peer address and refuses (closes at once) one over the
  listener's per-peer cap;
- it keeps the listener's total under its cap, and the connections of all the
  process's listeners together under what its file-descriptor limit leaves to spare
  (:data:`FD_RESERVE`): at a cap, a new connection evicts the one idle the longest
  (of the listener, or of the process), so that strangers holding sockets open cannot
  lock a real peer out; with none idle, the new one is refused;
- it closes a connection at the deadline the connection itself names
  (:meth:`Watched.deadline`: idle too long, a request's headers or body too slow),
  and turns on TCP keepalive, so that a peer that vanished mid-call is found by the
  kernel.

:class:`FloodLog` logs each kind of refusal once per interval with a count, instead
of a line (or a traceback) per connection or request.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
import weakref
from collections.abc import Callable
from typing import ClassVar, Protocol

log = logging.getLogger(__name__)

FD_RESERVE = 64
"""File descriptors kept free of the listeners' connections: the database and its
journal, app pipes and logs need them."""


def process_cap() -> int | None:
    """The most connections all listeners may hold: :data:`FD_RESERVE` under the fd limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - FD_RESERVE)


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


class Watched(Protocol):
    """A connection as its :class:`ConnectionGuard` sees it (the protocol object itself)."""

    def busy(self) -> bool:
        """Whether a call or request is being handled: such a connection is never evicted."""
        ...

    def idle_since(self) -> float:
        """The loop time since when nothing came; evictions take the oldest first."""
        ...

    def deadline(self, now: float) -> tuple[float, str]:
        """The loop time at which to close the connection, and why (``"idle"``, ...).

        Asked again at that time: the connection may name a later one by then.
        """
        ...

    def abort(self) -> None:
        """Close the connection at once, and forget it in its protocol."""
        ...


class ConnectionGuard:
    """The connections of one listener, kept within its caps and deadlines (see the module).

    ``name`` says which API in the log lines. The protocol calls :meth:`admit` when a
    connection is made (and aborts it if refused), :meth:`rearm` when its deadline
    may have come closer, and :meth:`forget` when it is lost. Every guard of the
    process is known to the others (:attr:`_every`): the descriptors they share
    are one limit.
    """

    _every: ClassVar[weakref.WeakSet[ConnectionGuard]] = weakref.WeakSet()

    def __init__(
        self, name: str, *, max_connections: int, connections_per_peer: int, flood: FloodLog
    ) -> None:
        self.name = name
        self.cap = max_connections
        self._per_peer = connections_per_peer
        self._flood = flood
        self._by_peer: dict[str, int] = {}
        self._peers: dict[Watched, str] = {}
        self._timers: dict[Watched, asyncio.TimerHandle] = {}
        ConnectionGuard._every.add(self)

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._peers)

    def admit(self, connection: Watched, transport: asyncio.BaseTransport) -> bool:
        """Count ``connection`` in, evicting the idlest at the cap; False: refuse it."""
        address = transport.get_extra_info("peername")
        peer = str(address[0]) if isinstance(address, tuple) else str(address)
        if self._by_peer.get(peer, 0) >= self._per_peer:
            self._flood.warn(
                f"{self.name}-peer-connections",
                "refused a %s connection from %s: it holds %d, the most one peer may",
                self.name,
                peer,
                self._per_peer,
            )
            return False
        if len(self._peers) >= self.cap and not self._evict_idlest([self]):
            self._flood.warn(
                f"{self.name}-connections",
                "refused a %s connection from %s: %d are open, none idle",
                self.name,
                peer,
                len(self._peers),
            )
            return False
        every = list(ConnectionGuard._every)
        in_process, cap = sum(guard.connections for guard in every), process_cap()
        if cap is not None and in_process >= cap and not self._evict_idlest(every):
            self._flood.warn(
                f"{self.name}-descriptors",
                "refused a %s connection from %s: the listeners hold %d, the most the "
                "open-file limit leaves room for, none idle",
                self.name,
                peer,
                in_process,
            )
            return False
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _keepalive(sock)
        self._peers[connection] = peer
        self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        self.rearm(connection)
        return True

    def forget(self, connection: Watched) -> None:
        """``connection`` is closed: it no longer counts (idempotent)."""
        peer = self._peers.pop(connection, None)
        if peer is None:
            return
        timer = self._timers.pop(connection, None)
        if timer is not None:
            timer.cancel()
        left = self._by_peer.get(peer, 1) - 1
        if left:
            self._by_peer[peer] = left
        else:
            self._by_peer.pop(peer, None)

    def rearm(self, connection: Watched) -> None:
        """Check ``connection`` at the deadline it names now."""
        if connection not in self._peers:
            return
        loop = asyncio.get_running_loop()
        timer = self._timers.get(connection)
        if timer is not None:
            timer.cancel()
        at, _ = connection.deadline(loop.time())
        self._timers[connection] = loop.call_at(at, self._check, connection)

    def _check(self, connection: Watched) -> None:
        peer = self._peers.get(connection)
        if peer is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        at, reason = connection.deadline(now)
        if now < at:
            self._timers[connection] = loop.call_at(at, self._check, connection)
            return
        self._flood.warn(
            f"{self.name}-{reason}",
            "closed a %s connection from %s: %s",
            self.name,
            peer,
            reason,
        )
        self.forget(connection)
        connection.abort()

    def _evict_idlest(self, guards: list[ConnectionGuard]) -> bool:
        """Close the connection of ``guards`` idle the longest; False if none is idle."""
        idle = [
            (connection.idle_since(), guard, connection)
            for guard in guards
            for connection in guard._peers
            if not connection.busy()
        ]
        if not idle:
            return False
        _, guard, idlest = min(idle, key=lambda entry: entry[0])
        self._flood.warn(
            f"{self.name}-evicted",
            "the %s API is at a connection cap: closed the idlest, a %s connection from %s",
            self.name,
            guard.name,
            guard._peers[idlest],
        )
        guard.forget(idlest)
        idlest.abort()
        return True


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive: a peer that vanished is found in about two minutes, even mid-call."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
