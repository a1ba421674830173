"""Plain ``def`` handlers run on daemon threads, so a hung one cannot outlive its run.

A handler that blocks for ever (a deadlock, a read with no timeout) is abandoned when
its message runs out of time: its caller stops waiting and answers the message with an
error. The thread itself cannot be stopped. anyio's worker threads are not daemons, so
the interpreter would wait for such a thread at exit — a finished simulation that never
ends its process. These threads are daemons, reused while idle as anyio's are, and end
with the process.

A daemon thread still inside a C++ library (torch's autograd, say) when the interpreter
exits can abort the process (``terminate called without an active exception``), so
whoever ends a run waits for the handlers still running first (:func:`wait_for_handlers`),
for a while; ``fedcore`` then ends its process without the interpreter's exit if some
still run (:func:`handlers_running`, :func:`fedcore.cli.main`).
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
_all_idle = threading.Condition(_idle_lock)
_busy = 0


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

    global _busy
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
        _busy += 1
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
    global _busy
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
            _busy -= 1
            _all_idle.notify_all()


def handlers_running() -> int:
    """How many handlers run on these threads now (abandoned ones included)."""
    with _idle_lock:
        return _busy


def wait_for_handlers(timeout: float) -> int:
    """Block until no handler runs on these threads, or for ``timeout`` s; return how
    many still run then (abandoned ones included: they have not returned either)."""
    with _all_idle:
        _all_idle.wait_for(lambda: _busy == 0, timeout)
        return _busy
