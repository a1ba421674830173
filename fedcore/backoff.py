"""Exponential backoff with full jitter, on the injected clock: how every client retries.

A node that loses its link must not hammer it when it comes back, and a thousand
nodes that lost it together must not come back in lockstep; the same goes for a
ServerApp's and an exec's calls to a link that restarts. So the n-th retry in a
row waits a random time between 0 and ``min(maximum, initial × factor**n)`` ("full
jitter"): the ceiling grows until it reaches the cap, and the randomness spreads
the nodes out. A success resets the count. The randomness is a ``random.Random``
that the caller may seed, so a test (or a chaos run printing its seed) sees the same
delays every time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fedcore.clock import Clock


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How retries space out: the first ceiling, the cap, and the growth per retry."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        for name in ("initial", "maximum"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"BackoffPolicy.{name} must be a positive number, got {value!r}")
        if self.maximum < self.initial:
            raise ValueError(
                f"BackoffPolicy.maximum ({self.maximum}) is below initial ({self.initial})"
            )
        if not 1 <= self.factor < math.inf:
            raise ValueError(f"BackoffPolicy.factor must be at least 1, got {self.factor!r}")


DEFAULT_BACKOFF = BackoffPolicy()
"""Half a second at first, doubling to at most 30 s."""


class Backoff:
    """The delays of one sequence of retries; :meth:`reset` after a success."""

    def __init__(self, clock: Clock, policy: BackoffPolicy, rng: random.Random) -> None:
        self._clock = clock
        self._policy = policy
        self._rng = rng
        self._ceiling = policy.initial

    def next_delay(self) -> float:
        """The time to wait before the next retry; each call raises the ceiling (to the cap)."""
        delay = self._rng.uniform(0.0, self._ceiling)
        self._ceiling = min(self._policy.maximum, self._ceiling * self._policy.factor)
        return delay

    async def wait(self, at_least: float = 0.0) -> None:
        """Sleep :meth:`next_delay` seconds of the clock, after ``at_least`` seconds (the
        wait a busy server asked for; the random delay spreads those it asked at once)."""
        await self._clock.sleep(at_least + self.next_delay())

    def reset(self) -> None:
        """Start over from the first ceiling: the last attempt succeeded."""
        self._ceiling = self._policy.initial
