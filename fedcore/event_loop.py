"""The event loop of a blocking run: which loop it runs on, and the signals that end it.

The blocking runs fedcore starts (``run_simulation``, ``fedcore serve``, a ServerApp
process) start their loop here: on uvloop where it is installed, asyncio's own loop
elsewhere (Windows).

A run holds what the operating system does not take back when its process dies
(shared-memory segments in ``/dev/shm`` outlive their creator), so a signal that ends
the process must let the run clean up first, as Ctrl-C does; SIGTERM (``kill``,
``docker stop``, a batch scheduler) and SIGHUP (a closed terminal) are how runs left
overnight usually end. Inside :class:`Ending` the first of these signals cancels the
run; a second, while the cleanup runs, exits at once, after the ``abandon`` callback:
the cleanup may wait for good on a thread that never returns. Only signals left at
their default disposition are taken (a SIGHUP ignored under ``nohup`` is kept), and
only in the main thread, the one Python delivers signals to.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator
from types import FrameType, TracebackType
from typing import Self, TypeVar, TypeVarTuple

import anyio

log = logging.getLogger(__name__)

ENDING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that end a run; SIGHUP does not exist on Windows."""

T = TypeVar("T")
Args = TypeVarTuple("Args")

_Handler = Callable[[int, FrameType | None], object] | int | None


def exit_status(signum: int) -> int:
    """The status a process ends with when ``signum`` ended it: ``128 + signum``."""
    return 128 + signum


def _at_default(signum: int) -> bool:
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    return signal.getsignal(signum) is default


def _label(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Ending:
    """The ending signals of one blocking run: the first stops it, a second exits at once.

    ``what`` names the run in the log line the first signal writes; ``abandon`` is
    called before an exit at once, to release at least what it can without waiting;
    ``signals`` are the ones taken (a served role keeps SIGHUP for reloading).
    Enter it before the event loop starts (asyncio takes SIGINT for itself only while
    SIGINT has its default handler) and put the run inside :meth:`cancelling`.
    """

    def __init__(
        self,
        what: str,
        abandon: Callable[[], None],
        signals: Collection[int] = ENDING_SIGNALS,
    ) -> None:
        self.what = what
        self.received: signal.Signals | None = None
        self._abandon = abandon
        self._signals = tuple(signals)
        self._saved: dict[int, _Handler] = {}
        self._cancel: Callable[[], None] | None = None

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                if _at_default(signum):
                    self._saved[signum] = signal.getsignal(signum)
                    signal.signal(signum, self._receive)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved.clear()

    @contextlib.contextmanager
    def cancelling(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Within this block, on the running asyncio loop, the first signal cancels ``scope``."""
        loop = asyncio.get_running_loop()

        def cancel() -> None:  # from the handler: the loop runs the callback when it can
            loop.call_soon_threadsafe(self._stop, scope)

        self._cancel = cancel
        if self.received is not None:  # it came while the loop was starting
            self._stop(scope)
        try:
            yield
        finally:
            self._cancel = None

    def end_as_received(self) -> None:
        """Raise what the received signal asks for, if one came; else return."""
        if self.received is None:
            return
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(exit_status(self.received))

    def _receive(self, signum: int, frame: FrameType | None) -> None:
        """The handler: it runs in the main thread, between two bytecodes of whatever ran."""
        if self.received is None:
            self.received = signal.Signals(signum)
            if self._cancel is not None:
                self._cancel()
            return
        self._exit_at_once(signum)

    def _stop(self, scope: anyio.CancelScope) -> None:
        assert self.received is not None
        label = _label(self.received)
        again = "press Ctrl-C" if self.received == signal.SIGINT else f"send {label}"
        log.warning("%s: stopping %s (%s again to exit at once)", label, self.what, again)
        scope.cancel()

    def _exit_at_once(self, signum: int) -> None:
        # A signal may come while a stream is half-way through a write: nothing here may
        # wait or raise on its account, the exit is what matters.
        with contextlib.suppress(Exception):
            self._abandon()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(2, f"\n{_label(signum)} again: exiting at once\n".encode())
        os._exit(exit_status(signum))


def uvloop_installed() -> bool:
    """Whether runs here go on uvloop: it is installed everywhere but on Windows."""
    return importlib.util.find_spec("uvloop") is not None


def run_loop(main: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
    """Run ``main(*args)`` on a new event loop (uvloop where installed) and return its value."""
    return anyio.run(
        main, *args, backend="asyncio", backend_options={"use_uvloop": uvloop_installed()}
    )


def run_until_ended(
    main: Callable[[], Awaitable[T]],
    what: str,
    abandon: Callable[[], None] = lambda: None,
    signals: Collection[int] = ENDING_SIGNALS,
    *,
    end_as_received: bool = True,
) -> T | None:
    """Run ``main()`` as :func:`run_loop` does, until it returns or one of ``signals`` ends it.

    An ending signal cancels ``main`` (see :class:`Ending`); then, with ``end_as_received``,
    this raises what the signal asks for, and without it returns ``None``: a role served
    until stopped ends well when stopped.
    """
    with Ending(what, abandon, signals) as ending:
        result = run_loop(functools.partial(_until_ended, ending, main))
    if end_as_received:
        ending.end_as_received()
    return result


async def _until_ended(ending: Ending, main: Callable[[], Awaitable[T]]) -> T | None:
    with anyio.CancelScope() as scope, ending.cancelling(scope):
        return await main()
    return None
