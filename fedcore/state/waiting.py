"""The link's long polls: look, and look again whenever the state announces a change.

A node's pull, a ServerApp's wait for replies or nodes, an exec's wait for a run:
each looks at the state, and if what it wants is not there yet, sleeps until the
state announces a relevant change or its wait runs out — never polling. Subscribing
before the first look means no change between a look and the sleep goes unheard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from fedcore.clock import Clock
from fedcore.state.notify import Subscription

T = TypeVar("T")


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
    changed = anyio.Event()

    def wake(key: Any) -> None:
        if relevant(key):
            changed.set()

    deadline = clock.now() + wait_seconds
    with watch(wake):
        while not done(result := await look()):
            remaining = deadline - clock.now()
            if remaining <= 0:
                break
            with clock.move_on_after(remaining):
                await changed.wait()
            changed = anyio.Event()
    return result
