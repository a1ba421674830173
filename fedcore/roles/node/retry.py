"""Calling the link again while it is away, and saying so once per outage.

:class:`~fedcore.errors.LinkUnavailableError` is the one failure of a fleet call that
a node retries: everything else the link answers is final for that request. Its
subclass :class:`~fedcore.errors.LinkBusyError` (the link's "too many requests") is
retried the same way: a rate limit, spent perhaps by a stranger behind the same NAT,
is an episode to wait out, never a reason for the node to stop; the wait the link
asked for (:attr:`~fedcore.errors.LinkBusyError.retry_after`) comes before the
backoff's own (:func:`asked_wait`). Every loop and
message task of a node retries on its own :class:`Backoff`, but they share one
:class:`Retrier`, so an episode is logged once when it begins (the first refusal's
reason) and once when it ends ("back"), however many calls noticed in between.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.clock import Clock
from fedcore.errors import LinkBusyError, LinkUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Retrier:
    """Retries fleet calls with backoff while the link is unavailable; tracks outages."""

    def __init__(self, clock: Clock, policy: BackoffPolicy, seed: int | None) -> None:
        self._clock = clock
        self._policy = policy
        self._seeds = random.Random(seed)
        self._down_since: float | None = None

    def backoff(self) -> Backoff:
        """A fresh backoff with its own random stream, drawn from the seeded one."""
        return Backoff(self._clock, self._policy, random.Random(self._seeds.getrandbits(64)))

    async def __call__(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` until it does not raise LinkUnavailableError; its result."""
        backoff = self.backoff()
        while True:
            try:
                result = await call()
            except LinkUnavailableError as exc:
                self.unavailable(exc)
                await backoff.wait(asked_wait(exc))
            else:
                self.available()
                return result

    def unavailable(self, exc: LinkUnavailableError) -> None:
        """A call found the link away (or busy); the first one of an episode logs it."""
        if self._down_since is None:
            self._down_since = self._clock.now()
            log.warning("%s; retrying with backoff until it answers", exc)

    def available(self) -> None:
        """A call reached the link; the first one after an outage logs it."""
        if self._down_since is not None:
            away = self._clock.now() - self._down_since
            self._down_since = None
            log.info("the link is back after %.1f s", away)


def asked_wait(exc: LinkUnavailableError) -> float:
    """The seconds the link asked the caller to wait before calling again (0.0: none)."""
    return exc.retry_after if isinstance(exc, LinkBusyError) else 0.0
