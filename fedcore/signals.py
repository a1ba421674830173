"""Ending a blocking run on a signal: Ctrl-C, SIGTERM and SIGHUP alike.

A run holds what the operating system does not take back when its process dies:
shared-memory segments in ``/dev/shm`` outlive their creator. So a signal that ends
the process must let the run clean up first, as Ctrl-C does — and SIGTERM (``kill``,
``docker stop``, a batch scheduler's time limit) and SIGHUP (a closed terminal or SSH
session) are how runs left overnight usually end.

Inside :class:`Ending`, the first of these signals cancels the run — its backends
stop their workers and unlink their segments — and :meth:`Ending.end_as_received`
then ends the caller as the signal asks: ``KeyboardInterrupt`` for SIGINT (status
130 at the top), ``SystemExit(128 + N)`` for the others (143 for SIGTERM, 129 for
SIGHUP: what a shell reports for a process the signal killed), so the caller's own
``finally`` blocks still run. A second signal while the cleanup runs ends the process
at once with the same kind of status, after the ``abandon`` callback: the cleanup may
wait for good on a thread that never returns (a plain ``def`` handler stuck in a
loop), and Python's exit would wait on that thread too, then print a ``threading``
traceback at the next Ctrl-C.

Only signals left at their default disposition are taken — a SIGHUP ignored under
``nohup``, or a handler the caller installed, is kept — and only in the main thread,
the one Python delivers signals to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Self

import anyio

log = logging.getLogger(__name__)

ENDING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that end a run; SIGHUP does not exist on Windows."""

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
    called before an exit at once, to release at least what it can without waiting.
    Enter it before the event loop starts (asyncio takes SIGINT for itself only while
    SIGINT has its default handler) and put the run inside :meth:`cancelling`.
    """

    def __init__(self, what: str, abandon: Callable[[], None]) -> None:
        self.what = what
        self.received: signal.Signals | None = None
        self._abandon = abandon
        self._saved: dict[int, _Handler] = {}
        self._cancel: Callable[[], None] | None = None

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in ENDING_SIGNALS:
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
