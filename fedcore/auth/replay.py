"""Freshness and one-time use of signed requests: the timestamp window and the nonces seen.

Both signed APIs — the exec API (HMAC with a shared secret,
:mod:`fedcore.auth.exec_signatures`) and the fleet API (node keys,
:mod:`fedcore.auth.signatures`) — stamp each request with the sender's clock and a
random nonce. The receiver accepts a timestamp within ``max_skew`` seconds of its own
clock, and each nonce once. It remembers a nonce until its timestamp is too old to
pass anyway, so memory is bounded by the requests of one window, and it is asked to
remember only nonces of requests whose signature it has checked, so nobody without a
key can fill it.

The nonces die with the receiver's process. What keeps a request captured before a
restart from passing after it is the link's name, new at each start, which both APIs'
signatures cover (:mod:`fedcore.auth.stamps`): not this window.
"""

from __future__ import annotations

import heapq

from fedcore.clock import Clock
from fedcore.errors import AuthenticationError

MAX_SKEW = 30.0
"""Seconds a request's timestamp may differ from the receiver's clock, either way."""
MAX_NONCES = 100_000
"""Nonces remembered at once: more requests than this within one window are refused."""


class ReplayGuard:
    """Refuses stale timestamps and nonces seen before, on ``clock``'s time."""

    def __init__(
        self, clock: Clock, *, max_skew: float = MAX_SKEW, max_nonces: int = MAX_NONCES
    ) -> None:
        if not max_skew > 0 or max_nonces < 1:
            raise ValueError("max_skew must be positive and max_nonces at least 1")
        self._clock = clock
        self.max_skew = max_skew
        self._max_nonces = max_nonces
        self._nonces: set[str] = set()
        self._forget: list[tuple[float, str]] = []
        """A heap of (when a nonce may be forgotten, the nonce)."""

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now (for tests of the bound)."""
        return len(self._nonces)

    def check_fresh(self, timestamp: float) -> None:
        """``AuthenticationError`` unless ``timestamp`` is within the window of now."""
        skew = timestamp - self._clock.now()
        if abs(skew) > self.max_skew:
            raise AuthenticationError(
                f"the request's timestamp is {skew:+.0f} s off the receiver's clock "
                f"(at most ±{self.max_skew:g} s): check both machines' clocks"
            )

    def use_once(self, nonce: str, timestamp: float) -> None:
        """Accept ``nonce`` of a verified request stamped ``timestamp``, once.

        ``AuthenticationError`` for a nonce accepted before (a replay), or when the
        window already holds :data:`MAX_NONCES`.
        """
        now = self._clock.now()
        while self._forget and self._forget[0][0] < now:
            self._nonces.discard(heapq.heappop(self._forget)[1])
        if nonce in self._nonces:
            raise AuthenticationError("the nonce was used before (a replayed request)")
        if len(self._nonces) >= self._max_nonces:
            raise AuthenticationError(
                f"over {self._max_nonces} requests within {self.max_skew:g} s"
            )
        self._nonces.add(nonce)
        # Past this time the timestamp is too old to pass check_fresh(): the nonce can go.
        heapq.heappush(self._forget, (timestamp + self.max_skew, nonce))
