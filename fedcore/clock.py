"""The injected clock: the only place fedcore reads time or waits for it.

Heartbeats, TTLs, leases, timeouts and round timings all go through a :class:`Clock`,
so tests swap in ``fedcore.testing.FakeClock`` and a 12-hour TTL expires in a
millisecond. Timeouts are cancel scopes from :meth:`Clock.move_on_after` rather than
``anyio.move_on_after``, because anyio's deadlines follow the event loop's clock,
which a fake clock cannot move.

Code that cannot be handed a clock — ``Message(...)`` in an app stamps its creation
time, as Flower's does — reads :func:`current_clock`: the system clock, unless a
caller put another in place for its context with :func:`using_clock`.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

import anyio


class Clock(ABC):
    """Wall time, sleeping and deadlines."""

    @abstractmethod
    def now(self) -> float:
        """Seconds since the Unix epoch (comparable across processes and machines)."""

    @abstractmethod
    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (at least one scheduling point)."""

    @abstractmethod
    def move_on_after(self, seconds: float | None) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope that cancels its body after ``seconds`` (never when ``None``).

        As with ``anyio.move_on_after``, the scope's ``cancelled_caught`` tells whether
        the deadline ended the body.
        """


class SystemClock(Clock):
    """The real clock: ``time.time()`` and the event loop's timers."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(seconds, 0.0))

    def move_on_after(self, seconds: float | None) -> AbstractContextManager[anyio.CancelScope]:
        if seconds is None or math.isinf(seconds):
            return anyio.CancelScope()
        return anyio.move_on_after(max(seconds, 0.0))


_SYSTEM_CLOCK = SystemClock()
_current: ContextVar[Clock | None] = ContextVar("fedcore_clock", default=None)


def current_clock() -> Clock:
    """The clock of this context: the system clock unless :func:`using_clock` set another."""
    return _current.get() or _SYSTEM_CLOCK


@contextmanager
def using_clock(clock: Clock) -> Iterator[Clock]:
    """Make ``clock`` the :func:`current_clock` of this context (and of the threads and
    tasks started from it) until the block ends."""
    token = _current.set(clock)
    try:
        yield clock
    finally:
        _current.reset(token)


def utc_now(clock: Clock | None = None) -> datetime:
    """This moment on ``clock`` (:func:`current_clock` by default) as a timezone-aware UTC datetime.

    Flower's ``flwr.common.now()``, which apps use to stamp what they write.
    """
    return datetime.fromtimestamp((clock or current_clock()).now(), UTC)
