"""Long polls over a state: look, and look again whenever the state announces a change.

A node's pull, a ServerApp's wait for replies or nodes, an exec's wait for a run:
each looks at the state, and if what it wants is not there yet, sleeps until the
state announces a relevant change or its wait runs out — never polling. Subscribing
before the first look means no change between a look and the sleep goes unheard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio

from fedcore.clock import Clock
from fedcore.state.notify import Subscription

K = TypeVar("K")
T = TypeVar("T")


class Announcements(Generic[K]):
    """What a state announced since ``watch(callback)`` subscribed, heard in batches.

    Use it as a context manager: the subscription lasts the ``with`` block, so a
    waiter that looks, hands out what it found and looks again hears every change
    in between. Only the keys for which ``relevant`` holds are kept.
    """

    def __init__(
        self,
        watch: Callable[[Callable[[Any], None]], Subscription],
        *,
        relevant: Callable[[Any], bool] = lambda _: True,
    ) -> None:
        self._watch = watch
        self._relevant = relevant
        self._heard: list[K] = []
        self._changed = anyio.Event()
        self._subscription: Subscription | None = None

    def __enter__(self) -> Announcements[K]:
        self._subscription = self._watch(self._hear)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._subscription is not None:
            self._subscription.close()

    def _hear(self, key: K) -> None:
        if self._relevant(key):
            self._heard.append(key)
            self._changed.set()

    async def next(self, clock: Clock, seconds: float | None) -> list[K]:
        """The keys heard since the last call, waiting up to ``seconds`` for a first one
        (``None``: for as long as it takes); empty when the wait ran out."""
        if not self._heard and (seconds is None or seconds > 0):
            with clock.move_on_after(seconds):
                await self._changed.wait()
        heard, self._heard = self._heard, []
        self._changed = anyio.Event()
        return heard


async def look_until(
    clock: Clock,
    watch: Callable[[Callable[[Any], None]], Subscription],
    look: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    wait_seconds: float,
    *,
    relevant: Callable[[Any], bool] = lambda _: True,
) -> T:
    """``look()`` until ``done`` with its result, or ``wait_seconds`` pass; the last result.

    ``watch(callback)`` subscribes to the state's announcements; one for which
    ``relevant`` holds wakes the next look.
    """
    if not wait_seconds >= 0:
        raise ValueError(f"wait_seconds must not be negative, got {wait_seconds}")
    deadline = clock.now() + wait_seconds
    with Announcements[Any](watch, relevant=relevant) as heard:
        while not done(result := await look()):
            remaining = deadline - clock.now()
            if remaining <= 0:
                break
            await heard.next(clock, remaining)
    return result
