"""Feeding a run's trackers from a thread of their own: :class:`Trackers`.

Trackers do I/O (MLflow's client over HTTP, W&B's service process) and the round
driver reports rounds on the event loop, so :meth:`Trackers.log_round` only queues a
round, and one thread, the feed's own, calls every tracker in order: each tracker sees
all its calls from that thread, which also suits libraries that are not thread-safe.
A tracker that cannot start ends the command before the run; one that fails later is
dropped with a warning, and the run goes on (docs/cli.md, ``--track``).
:meth:`Trackers.finish` waits at most ``finish_timeout`` seconds, so a tracking server
that stopped answering cannot hold the end of the run.

:class:`TrackingHandler` is the simulation's adapter: a logging handler that passes
each round report on as its ``metrics.jsonl`` line.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from fedcore.clock import Clock, SystemClock
from fedcore.errors import TrackerError
from fedcore.results.metrics import round_row
from fedcore.results.trackers.base import TrackedRun, Tracker, round_metrics
from fedcore.strategy.result import RoundReport

log = logging.getLogger(__name__)

DEFAULT_FINISH_TIMEOUT = 60.0
"""How long the end of a run waits for its trackers to write what is queued, in seconds."""


class Trackers:
    """A run's trackers and the thread that calls them."""

    def __init__(
        self,
        trackers: Sequence[Tracker],
        *,
        clock: Clock | None = None,
        finish_timeout: float = DEFAULT_FINISH_TIMEOUT,
    ) -> None:
        self._live = list(trackers)
        self._clock = clock or SystemClock()
        self._finish_timeout = finish_timeout
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="fedcore-trackers", daemon=True)
        self._busy: Tracker | None = None
        self.where: dict[str, dict[str, str]] = {}
        """Where each tracker records the run, once started: ``run.json``'s ``trackers``."""

    def start(self, run: TrackedRun) -> None:
        """Start every tracker on the feed's thread; blocks until they have."""
        self._thread.start()
        started: Future[None] = Future()

        def start_all() -> None:
            tracker = None
            try:
                for tracker in self._live:
                    self.where[tracker.name] = tracker.start(run)
            except BaseException as exc:
                for opened in self._live:
                    if opened.name in self.where:
                        _close_quietly(opened, run.started)
                self._live = []
                started.set_exception(_refusal(exc, tracker))
            else:
                started.set_result(None)

        self._calls.put(start_all)
        try:
            started.result()
        except BaseException:
            self._calls.put(None)
            raise

    def log_round(self, row: Mapping[str, Any]) -> None:
        """Queue a finished round (its ``metrics.jsonl`` line) for every tracker."""
        step, metrics, at = int(row["round"]), round_metrics(row), self._clock.now()
        self._calls.put(
            lambda: self._each(f"round {step}", lambda t: t.log_round(step, metrics, at))
        )

    def finish(self, status: str) -> None:
        """Close every tracker's run as ``status`` once the rounds queued before are written."""
        at = self._clock.now()
        self._calls.put(lambda: self._each("the end of the run", lambda t: t.finish(status, at)))
        self._calls.put(None)
        self._thread.join(self._finish_timeout)
        busy = self._busy
        if self._thread.is_alive() and busy is not None:
            log.warning(
                "the %s tracker did not finish within %g s; this run leaves it unfinished",
                busy.name,
                self._finish_timeout,
            )

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self._live):
            self._busy = tracker
            try:
                call(tracker)
            except Exception as exc:
                self._live.remove(tracker)
                log.warning(
                    "the %s tracker failed at %s and records nothing more of this run "
                    "(the results directory keeps every round): %s",
                    tracker.name, what, _one_line(exc),
                )  # fmt: skip
            finally:
                self._busy = None

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()


class TrackingHandler(logging.Handler):
    """Hands each round report logged during the run to ``trackers``."""

    def __init__(self, trackers: Trackers) -> None:
        super().__init__(logging.INFO)
        self.trackers = trackers

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "fedcore_round", None)
        if isinstance(report, RoundReport):
            self.trackers.log_round(round_row(report))


def _refusal(exc: BaseException, tracker: Tracker | None) -> BaseException:
    if isinstance(exc, TrackerError) or not isinstance(exc, Exception) or tracker is None:
        return exc
    return TrackerError(f"the {tracker.name} tracker could not start: {_one_line(exc)}")


def _close_quietly(tracker: Tracker, at: float) -> None:
    """Close a started tracker's run because another refused to start (it never ran)."""
    try:
        tracker.finish("failed", at)
    except Exception as exc:
        log.debug("closing the %s tracker: %s", tracker.name, _one_line(exc))


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line; a long one keeps its start and its end (where a
    library's message says what to do about it)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 1000 else f"{text[:300]} … {text[-600:]}"
