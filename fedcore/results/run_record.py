"""A run's record while its ServerApp runs, the same for both runtimes: :class:`RunRecord`.

The simulation keeps a run's record in a results directory (and its trackers), a
deployed ServerApp on the link; both keep it the same way. While ``main`` runs, the
record's handlers hear each round the strategy reports, the last round says whether a
run whose ``main`` returned completed, and the strategy's ``start`` keeps its round
checkpoints in the record's store and goes on from the one it resumes from.
:func:`results_record` composes the simulation's: its directory (a new one, or the
one a resumed run goes on in), its trackers, and how the record ends.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.to_thread

from fedcore.clock import Clock
from fedcore.domain import RecordDict
from fedcore.results.checkpoint import CHECKPOINT_FILE, CheckpointFile
from fedcore.results.directory import ResultsRecorder, new_run_directory, recording, run_name
from fedcore.results.plot import draw_summary
from fedcore.results.resume import Resumption
from fedcore.results.trackers.base import TrackedRun, Tracker
from fedcore.results.trackers.feed import Trackers, TrackingHandler
from fedcore.strategy.checkpoint import (
    Checkpoint,
    CheckpointStore,
    RoundCheckpoints,
    checkpointing,
)
from fedcore.strategy.result import LastRound, RoundReport, unfinished_reason

log = logging.getLogger("fedcore.results")


class RunRecord:
    """A run's record: entered around its ServerApp's ``main``.

    ``hearers`` (logging handlers) hear every log record of the process while the
    block runs (:func:`~fedcore.results.directory.recording`), round reports included;
    with none, nothing is recorded and the loggers are left alone. ``store``, where
    the run keeps round checkpoints, gets one after each round of its strategy's first
    ``start``, and ``resume_from`` is the checkpoint that ``start`` goes on from.
    """

    def __init__(
        self,
        *hearers: logging.Handler,
        store: CheckpointStore | None = None,
        resume_from: Checkpoint | None = None,
    ) -> None:
        self._hearers = hearers
        self._rounds = LastRound()
        self._store = store
        self.resume_from = resume_from
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        with contextlib.ExitStack() as stack:
            for hearer in self._hearers:
                stack.enter_context(recording(hearer))
            if self._hearers:  # what keeps the run's end hears its rounds
                stack.enter_context(recording(self._rounds))
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stack.close()

    @property
    def last(self) -> RoundReport | None:
        """The last round the strategy reported while the record was entered."""
        return self._rounds.last

    def unfinished(self) -> str | None:
        """Why the run, whose ``main`` returned, did not complete; ``None`` if it did
        (:func:`~fedcore.strategy.result.unfinished_reason`)."""
        return unfinished_reason(self.last)

    def checkpointing(
        self, nodes: Callable[[], Mapping[int, RecordDict]] | None = None
    ) -> contextlib.AbstractContextManager[object]:
        """Round checkpoints kept in the store while the block (``main``) runs, the first
        ``start`` going on from :attr:`resume_from`; nothing where the run keeps none.
        ``nodes`` gives each node's ``Context.state`` where the runtime holds them."""
        if self._store is None:
            return contextlib.nullcontext()
        return checkpointing(
            RoundCheckpoints(self._store, resume_from=self.resume_from, nodes=nodes)
        )


class ResultsRecord(RunRecord):
    """A simulated run's record: its results directory ``path`` (``None`` where it keeps
    none) and its trackers; :meth:`finish` ends both."""

    def __init__(
        self,
        path: Path | None,
        recorder: ResultsRecorder | None,
        tracking: Trackers | None,
        resume_from: Checkpoint | None,
    ) -> None:
        hearers: list[logging.Handler] = []
        if tracking is not None:
            hearers.append(TrackingHandler(tracking))
        if recorder is not None:
            hearers.append(recorder)
        store = None if path is None else CheckpointFile(path)
        super().__init__(*hearers, store=store, resume_from=resume_from)
        self.path = path
        self._recorder = recorder
        self._tracking = tracking
        self.ended = False

    async def finish(
        self, value: object, status: str, ended: float, error: str | None = None
    ) -> None:
        """End the run's trackers, then its results directory (which then holds what they
        warned of): its ``run.json`` says ``status`` (and ``error``), ``value`` is its
        model if it is one."""
        self.ended = True
        if self._tracking is not None:
            await anyio.to_thread.run_sync(self._tracking.finish, status)
        if self._recorder is not None:
            await anyio.to_thread.run_sync(self._recorder.finish, value, status, ended, error)

    async def complete(self, value: object, ended: float) -> None:
        """``main`` returned ``value``: the record ends completed (failed, if its last
        round trained nothing); the checkpoint goes and the summary is drawn."""
        unfinished = self.unfinished()
        status = "completed" if unfinished is None else "failed"
        await self.finish(value, status, ended, unfinished)
        if self.path is not None:
            CheckpointFile(self.path).remove()  # main ran to its end: nothing to go on with
            await anyio.to_thread.run_sync(draw_summary, self.path)
            log.info("results in %s", self.path)

    def say_where(self, ending: BaseException) -> None:
        """Tell the user of a run that did not complete where its record is, and how to go
        on with it from its last finished round: a note under a failure's traceback, a
        warning for an interruption (Ctrl-C, SIGTERM)."""
        if self.path is None:
            return
        where = f"results: {self.path}"
        if (self.path / CHECKPOINT_FILE).exists():
            where += f" (go on from its last finished round: fedcore simulate --resume {self.path})"
        if isinstance(ending, Exception):
            ending.add_note(where)
        else:
            log.warning("interrupted; %s", where)


@contextlib.asynccontextmanager
async def results_record(
    description: dict[str, Any],
    *,
    out: Path | None,
    resumption: Resumption | None,
    trackers: list[Tracker],
    clock: Clock,
    started: float,
) -> AsyncIterator[ResultsRecord]:
    """A simulated run's record, entered: a new results directory under ``out`` (none
    when ``out`` is ``None``) or the one ``resumption`` goes on in, and ``trackers``
    started (their places added to ``description``, ``run.json``'s opening content);
    ``started``: when the run began.

    A run that raises ends its record ``failed`` (``interrupted`` for Ctrl-C and the
    like) and is told where the record is; one that returns calls
    :meth:`ResultsRecord.complete` itself, with what ``main`` returned.
    """
    app_name, seed = description["app"], description["seed"]
    if resumption is not None:
        path: Path | None = resumption.path
    else:
        path = None if out is None else new_run_directory(out, app_name, seed, started)
    tracking = None
    if trackers:
        name = run_name(app_name, seed, started) if path is None else path.name
        run = TrackedRun(name, dict(description), path, started)
        tracking = await _start_tracking(Trackers(trackers, clock=clock), run)
        description["trackers"] = tracking.where
    recorder = None
    if resumption is not None:
        resumed_after = resumption.checkpoint.server_round
        recorder = ResultsRecorder(
            resumption.path, resumption.run, started, resumed_after=resumed_after
        )
    elif path is not None:
        recorder = ResultsRecorder(path, description, started)
    resume_from = None if resumption is None else resumption.checkpoint
    with ResultsRecord(path, recorder, tracking, resume_from) as record:
        if resumption is not None:
            log.info("resuming %s after round %d", path, resumption.checkpoint.server_round)
        try:
            yield record
        except BaseException as exc:
            if record.ended:  # what failed came after the record's end
                raise
            status = "failed" if isinstance(exc, Exception) else "interrupted"
            with anyio.CancelScope(shield=True):
                await record.finish(None, status, clock.now(), f"{type(exc).__name__}: {exc}")
            record.say_where(exc)
            raise


async def _start_tracking(tracking: Trackers, run: TrackedRun) -> Trackers:
    """``tracking`` started for ``run``, off the event loop (W&B starts a service, MLflow
    may call a server). One that refuses ends the run before it begins, so its results
    directory, made for it and still holding nothing of its own, goes too. Ctrl-C stops
    the wait for one slow to start (a tracking server that does not answer)."""
    try:
        await anyio.to_thread.run_sync(tracking.start, run, abandon_on_cancel=True)
    except BaseException:
        if run.directory is not None:
            shutil.rmtree(run.directory, ignore_errors=True)
        raise
    return tracking
