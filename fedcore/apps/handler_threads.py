"""Plain ``def`` handlers run on daemon threads, so a hung one cannot outlive its run.

A handler that blocks for ever (a deadlock, a read with no timeout) is abandoned when
its message runs out of time: its caller stops waiting and answers the message with an
error. The thread itself cannot be stopped. anyio's worker threads are not daemons, so
the interpreter would wait for such a thread at exit — a finished simulation that never
ends its process. These threads are daemons, reused while idle as anyio's are, and end
with the process.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

_Work = tuple[contextvars.Context, Callable[[], Any], Callable[[], None], list[Any]]

_idle: list[SimpleQueue[_Work]] = []
_idle_lock = threading.Lock()


async def run_in_thread(func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` on a daemon thread; cancelling the wait abandons the thread.

    The call sees the caller's context variables, and may reach the caller's event
    loop with ``anyio.from_thread`` given the loop's token.
    """
    loop = asyncio.get_running_loop()  # fedcore runs on asyncio (uvloop's or the stdlib's)
    done = anyio.Event()
    outcome: list[Any] = []

    def finished() -> None:
        # Not anyio.from_thread: that waits for the loop, and the thread would be idle
        # (and reusable) only once the loop got round to it.
        try:
            loop.call_soon_threadsafe(done.set)
        except RuntimeError:  # the loop is closed: nobody waits for the outcome
            return

    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = SimpleQueue()
        threading.Thread(target=_serve, args=(inbox,), name="fedcore handler", daemon=True).start()
    inbox.put((contextvars.copy_context(), lambda: func(*args), finished, outcome))
    await done.wait()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _serve(inbox: SimpleQueue[_Work]) -> None:
    while True:
        context, call, finished, outcome = inbox.get()
        try:
            outcome.append((True, context.run(call)))
        except BaseException as exc:  # handed to the caller, raised there
            outcome.append((False, exc))
        finished()
        del context, call, finished, outcome  # hold nothing of a call while idle
        with _idle_lock:
            _idle.append(inbox)
