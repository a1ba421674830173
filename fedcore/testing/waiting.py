"""Waiting, in real time, for what another process does.

An end-to-end test watches servers in processes of their own: it has no event to wait
on, so it polls. :func:`wait_until` is that poll loop, once: it hands back what the
condition returned as soon as that is truthy, and raises :class:`TimeoutError` saying
what it waited for once the deadline has passed — never a guessed sleep, never a spin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL = 0.05
"""Seconds between two looks: short beside the seconds a server takes, long beside a look."""


def wait_until(
    condition: Callable[[], T],
    deadline: float,
    what: str | Callable[[], str] = "the condition",
    *,
    interval: float = POLL_INTERVAL,
) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Raise :class:`TimeoutError` if it has not within ``deadline`` seconds; its message
    names ``what`` (a callable is called then, so it can show a log's tail as it is at
    the end). An exception ``condition`` raises ends the wait at once: a condition can
    fail fast on a state that will never turn into the one awaited.
    """
    give_up = time.monotonic() + deadline
    while not (value := condition()):
        if time.monotonic() > give_up:
            said = what() if callable(what) else what
            raise TimeoutError(f"not within {deadline:g} s: {said}")
        time.sleep(interval)
    return value
