"""A clock that moves only when a test says so."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio

from fedcore.clock import Clock


class FakeClock(Clock):
    """A :class:`~fedcore.clock.Clock` whose time advances only through :meth:`advance`.

    Sleeps and ``move_on_after`` deadlines become timers that fire, in deadline order,
    when the test advances past them. Everything runs on the test's event loop, so a
    test advances the clock and then yields (``await anyio.sleep(0)`` or waits on a
    condition) to let the woken tasks run.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cancelled: set[int] = set()

    def now(self) -> float:
        return self._now

    @property
    def pending_timers(self) -> int:
        """How many sleeps and deadlines are waiting for time to pass."""
        return len(self._timers) - len(self._cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward and fire every timer that falls due, earliest first."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            deadline, key, fire = heapq.heappop(self._timers)
            if key in self._cancelled:
                self._cancelled.discard(key)
                continue
            self._now = max(self._now, deadline)
            fire()
        self._now = target

    def _schedule(self, delay: float, fire: Callable[[], None]) -> int:
        key = next(self._order)
        heapq.heappush(self._timers, (self._now + max(delay, 0.0), key, fire))
        return key

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        key = self._schedule(seconds, woken.set)
        try:
            await woken.wait()
        finally:
            if not woken.is_set():
                self._cancelled.add(key)

    def move_on_after(self, seconds: float | None) -> AbstractContextManager[anyio.CancelScope]:
        return self._deadline_scope(seconds)

    @contextmanager
    def _deadline_scope(self, seconds: float | None) -> Iterator[anyio.CancelScope]:
        scope = anyio.CancelScope()
        key = None
        if seconds is not None and not math.isinf(seconds):
            key = self._schedule(seconds, scope.cancel)
        try:
            with scope:
                yield scope
        finally:
            if key is not None and not scope.cancel_called:
                self._cancelled.add(key)
