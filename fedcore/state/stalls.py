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
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedcore.clock import Clock

log = logging.getLogger(__name__)

STALL_PERIOD = 0.25
"""Seconds between the ticker's notes that the event loop is running."""
STALL_TOLERANCE = 1.0
"""Lateness past the period that counts as a stall: less is an ordinary busy loop."""

Stall = tuple[float, float]
"""A stall: the last moment the loop was seen running, and when it ran again."""


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
        while True:
            now = self._clock.now()
            stall = self.catch_up(now)
            if stall is not None:
                for listener in self._listeners:
                    listener(*stall)
            self._seen = max(self._seen, now)
            await self._clock.sleep(self.period)
