"""Telling the link's own stalls from its peers' silence.

A heartbeat deadline says "this peer did not reach us in time". That is true only if
the link was listening: while its event loop is blocked (a slow disk, a long decode,
a machine so loaded that the process gets no CPU), heartbeats pile up unread in the
sockets, and every deadline that passes meanwhile would blame a peer for the link's
own absence. So a state given a :class:`StallWatch` re-arms, rather than fires, the
liveness deadlines (node heartbeats, ServerApp heartbeats, message leases, run
claims) that fell inside a stall; message TTLs still fire, since they are promises to
the ServerApp, whose own clock ran on.

How a stall is seen: a ticker task sleeps on the injected clock for :attr:`period`
and notes each time it ran. A gap since the last note longer than
``period + tolerance`` is a stall. Whoever sees it first after the loop resumes —
the ticker itself, or a timer or call of the state, in whatever order the loop runs
them — reports it once, through :meth:`StallWatch.catch_up`, and the state re-arms
the deadlines inside it before it fires any timer. A peer that really died is still
found: its re-armed deadline passes with the link listening.

The same ticker measures how late each of its wakes was (:class:`LoopLag`): the
longest block of the loop since start and over the last minute, and a histogram,
which the link serves as metrics (``GET /v1/metrics``). A block shorter than the
period may be seen only in part, so the link ticks every :data:`LAG_PERIOD`.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Callable

from fedcore.clock import Clock

log = logging.getLogger(__name__)

STALL_PERIOD = 0.25
"""Seconds between the ticker's notes that the event loop is running."""
STALL_TOLERANCE = 1.0
"""Lateness past the period that counts as a stall: less is an ordinary busy loop."""

LAG_PERIOD = 0.01
"""The link's ticker period: short, so that the lag it sees of a block is nearly all of it."""
LAG_WINDOW = 60.0
"""Seconds of the recent window whose longest lag is kept."""
LAG_BUCKETS_MS = (1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0)
"""Upper bounds of the lag histogram's buckets; a last bucket holds the rest."""

Stall = tuple[float, float]
"""A stall: the last moment the loop was seen running, and when it ran again."""


class LoopLag:
    """How late the event loop woke the ticker: the longest since start, recently, and a histogram.

    The recent maximum is a sliding-window maximum (a deque of lags in decreasing
    order), so each note costs O(1) amortized, whatever the window.
    """

    def __init__(self, window: float = LAG_WINDOW, *, since: float = -math.inf) -> None:
        self.window = window
        self._since = since
        self.max_since_start = 0.0
        self.counts = [0] * (len(LAG_BUCKETS_MS) + 1)
        self._recent: deque[tuple[float, float]] = deque()

    def note(self, now: float, lag: float) -> None:
        """The loop woke a wake due at ``now - lag`` only at ``now``; one due before
        ``since`` (the start of the count) is left out."""
        if now - lag < self._since:
            return
        self.max_since_start = max(self.max_since_start, lag)
        self.counts[bisect.bisect_left(LAG_BUCKETS_MS, lag * 1000)] += 1
        while self._recent and self._recent[-1][1] <= lag:
            self._recent.pop()
        self._recent.append((now, lag))

    def recent_max(self, now: float) -> float:
        """The longest lag noted within the window before ``now``."""
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()
        return self._recent[0][1] if self._recent else 0.0


class StallWatch:
    """Notices when the event loop was not running, and reports each stall once.

    Run :meth:`run` as a task beside the state; call :meth:`catch_up` with the time of
    anything about to fire timers. ``on_stall(since, now)`` hears of each stall the
    ticker itself found (a state whose timers fire on the loop re-arms there).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        period: float = STALL_PERIOD,
        tolerance: float = STALL_TOLERANCE,
    ) -> None:
        if not (period > 0 and tolerance > 0):
            raise ValueError(f"period and tolerance must be positive, got {period}, {tolerance}")
        self.period = period
        self.tolerance = tolerance
        self._clock = clock
        self._seen = clock.now()
        self.lag = LoopLag()
        """How late the loop was in waking the ticker (see :class:`LoopLag`)."""
        self._listeners: list[Callable[[float, float], None]] = []

    def on_stall(self, listener: Callable[[float, float], None]) -> None:
        """Have ``listener(since, now)`` called for each stall the ticker finds."""
        self._listeners.append(listener)

    def catch_up(self, now: float) -> Stall | None:
        """The stall that ended at ``now``, if the loop was away; reported only once."""
        since = self._seen
        if now - since <= self.period + self.tolerance:
            return None
        self._seen = now
        log.warning(
            "the link's event loop stalled for %.1f s; heartbeat deadlines that passed "
            "meanwhile are re-armed, not fired",
            now - since,
        )
        return since, now

    async def run(self) -> None:
        """Note, every :attr:`period`, that the loop is running; report stalls found."""
        due = self._clock.now()
        while True:
            now = self._clock.now()
            self.lag.note(now, max(0.0, now - due))
            due = now + self.period
            stall = self.catch_up(now)
            if stall is not None:
                for listener in self._listeners:
                    listener(*stall)
            self._seen = max(self._seen, now)
            await self._clock.sleep(self.period)
