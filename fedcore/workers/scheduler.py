"""The job scheduler of the worker backends: one queue, and a driver per worker.

The process pool (:mod:`fedcore.workers.pool`) and the Ray backend
(:mod:`fedcore.simulation.backends.ray`) are channels to their workers; this module
decides what goes to which worker when, and what a failure costs.

Each message becomes a :class:`Job` in one queue. Each worker has a driver task that
sends it jobs in *calls* — one job each, or batches where a call costs more than a
short task (:attr:`WorkerBackend.max_batch`) — and settles them as their outcomes come
back, in order. While tasks are short (under :attr:`~WorkerBackend.short_task` each)
a driver keeps up to :attr:`~WorkerBackend.pipeline_depth` calls in flight, and a batch
grows as TCP's slow start does, twice as large after each whole batch; so a worker
goes from one task to the next without waiting. Once tasks take longer, it sends one
job at a time, so that no job waits behind a slow one while another worker is free. A
queue that ran dry (a new round, maybe of another kind of task) starts batches at one
job again.

Failures. A worker that dies answers the job it was running with code 8 and is
replaced. Where the channel says which job that was (:attr:`~WorkerBackend.exact_deaths`:
the outcomes of finished calls are read before a death shows) the others in flight
go back to the queue. Where it cannot, one job alone in flight is the one, and
otherwise every job in flight goes back to run *alone* — in a call of its own with
nothing else in flight — so that a job that kills its worker again is the one
answered with code 8. A call that fails on fedcore's side of a worker answers its job
with code 2 (a batch's jobs run again alone). A call still running when a TTL runs
out gets its worker stopped and replaced: the jobs past their TTL are answered with
code 3, a batch's others run again alone, and the calls behind it had not started and
go back as they were. A job whose TTL ran out while it was queued gets code 3 unsent.
"""

from __future__ import annotations

import contextlib
import logging
import math
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock
from fedcore.domain import Context, Error, ErrorCode, Message, RecordDict
from fedcore.errors import AppLoadError
from fedcore.workers.base import Backend

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One message on its way through a worker, and what came back.

    ``task`` is the message and its node's context in the worker protocol's bytes
    (:mod:`fedcore.wire.worker`); ``content`` what a backend keeps of the message's
    content beside them (Ray: its object in the store); ``alone``: it is to run in a
    call of its own (it was in flight when its worker died, with others).
    """

    message: Message
    task: bytes
    content: Any = None
    alone: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: Message | None = None
    state: RecordDict | None = None

    def settle(self, reply: Message, state: RecordDict | None = None) -> None:
        self.reply, self.state = reply, state
        self.done.set()

    def fail(self, code: ErrorCode, reason: str) -> None:
        self.settle(Message(error=Error(int(code), reason), reply_to=self.message))


@dataclass(eq=False)
class Call:
    """Jobs sent to a worker together, and the channel's handle on their outcomes."""

    jobs: list[Job]
    ref: Any = None

    @property
    def expires_at(self) -> float:
        return min(job.message.metadata.expires_at for job in self.jobs)


@dataclass(frozen=True)
class Collected:
    """What one wait for outcomes settled: ``ran`` jobs; ``whole``: the worker ran every
    job of the calls it answered; ``seconds`` the worker took for them, as it timed
    them (``None``: the driver times them)."""

    ran: int
    whole: bool = True
    seconds: float | None = None


class WorkerDied(Exception):
    """A worker is gone; the text says how."""


class CallFailed(Exception):
    """A call failed on fedcore's side of the worker, which lives on; the text says why."""


class Driven(Protocol):
    """A worker as its driver sees it: the calls in flight on it, oldest first."""

    in_flight: deque[Call]


W = TypeVar("W", bound=Driven)


class WorkerBackend(Backend, Generic[W]):
    """A backend whose ClientApps run in workers it starts on entry and ends on exit.

    Entering prepares (:meth:`_prepare`), opens the task group the workers' drivers run
    in (:attr:`_task_group`), and starts the workers (:meth:`_start_workers`, each
    worker's driver by :meth:`_drive`) within :attr:`start_timeout`; a failure on the
    way leaves nothing behind. A ClientApp that cannot be imported raises its
    :class:`~fedcore.errors.AppLoadError` (the first, not a group of them), and workers
    that do not start in time one saying so. Leaving cancels the drivers, then ends the
    workers (:meth:`_stop_workers`) shielded from cancellation, whatever ended the run.
    Once no worker is left, every queued job and every later one gets code 8.
    """

    start_timeout: float = 300.0
    worker_name: str = "worker"
    """What a worker is called in the replies that say none is left."""
    worker_word: str = "worker"
    """What a worker is called in the replies of a message it did not run to the end."""
    max_batch: int = 1
    """Jobs in one call at most, while tasks are short."""
    pipeline_depth: int = 1
    """Calls a worker may have in flight while its tasks are short."""
    pipeline_bytes: float = math.inf
    """Another call goes behind those in flight only while their tasks add up to less."""
    short_task: float = 0.005
    """Seconds per task under which tasks count as short."""
    exact_deaths: bool = False
    """Whether the first job in flight on a worker that died is the one it was running."""
    _task_group: TaskGroup | None = None

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._jobs_in, self._jobs_out = anyio.create_memory_object_stream[Job](math.inf)

    # What each backend provides -------------------------------------------------------

    @abstractmethod
    async def _job(self, message: Message, context: Context) -> Job:
        """``message`` for the node ``context`` describes, as a job for a worker."""

    async def _prepare(self) -> None:
        """What comes before the task group (a Ray session, a shared-memory sweep)."""

    @abstractmethod
    async def _start_workers(self) -> None:
        """Start every worker; drivers go in :attr:`_task_group`. Called with a deadline."""

    @abstractmethod
    def _log_started(self) -> None:
        """Log that the backend started: how many workers, where."""

    @abstractmethod
    def _too_slow(self) -> str:
        """The error of workers that did not start within :attr:`start_timeout`."""

    @abstractmethod
    async def _stop_workers(self, *, clean: bool) -> None:
        """End every worker and release what :meth:`_prepare` took. ``clean``: the run
        ended without an error, so workers may finish what they do (lifespans, grace)."""

    @abstractmethod
    async def _send(self, worker: W, in_flight: deque[Call], jobs: list[Job]) -> None:
        """Start a call of ``jobs`` on ``worker`` and append it to ``in_flight``; a
        worker that is gone shows in the next :meth:`_collect`."""

    @abstractmethod
    async def _collect(self, worker: W, in_flight: deque[Call]) -> Collected:
        """Wait for the outcomes of the first call in flight (and any that came with
        them); settle their jobs, remove the calls, and put back in the queue the jobs
        a call left unrun. Raises :class:`WorkerDied` or :class:`CallFailed`."""

    def _alive(self, worker: W) -> bool:
        """Whether ``worker`` may still be sent a job (one found dead while idle is
        replaced before it costs one)."""
        return True

    @abstractmethod
    async def _retire(self, worker: W) -> None:
        """Stop ``worker`` (dead, or past a TTL) and start its replacement."""

    # The lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._prepare()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            with anyio.fail_after(self.start_timeout):
                await self._start_workers()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, BaseExceptionGroup):
                load_errors = exc.subgroup(AppLoadError)
                if load_errors is not None:
                    raise load_errors.exceptions[0] from None
            if isinstance(exc, TimeoutError):
                raise AppLoadError(self._too_slow()) from None
            raise
        self._log_started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
                await self._task_group.__aexit__(None, None, None)
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True):
                await self._stop_workers(clean=exc_type is None)
            self._jobs_in.close()
            self._jobs_out.close()

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        job = await self._job(message, context)
        try:
            self._jobs_in.send_nowait(job)
        except anyio.ClosedResourceError:
            job.fail(
                ErrorCode.CLIENT_APP_CRASHED, f"no {self.worker_name} is left to run the ClientApp"
            )
        await job.done.wait()
        assert job.reply is not None
        if job.state is not None:
            context.state = job.state
        return job.reply, context

    def _abandon_queued(self, reason: str) -> None:
        """Answer every queued job, and every later one, with code 8: no worker is left."""
        self._jobs_in.close()
        while True:
            try:
                self._jobs_out.receive_nowait().fail(ErrorCode.CLIENT_APP_CRASHED, reason)
            except (anyio.WouldBlock, anyio.EndOfStream):
                return

    # The driver -------------------------------------------------------------------------

    async def _drive(self, worker: W) -> None:
        """Feed one worker calls of jobs, sized as its tasks go, and settle them as they
        return; once it is gone, start its replacement and end."""
        in_flight = worker.in_flight
        held: Job | None = None  # a job to run alone, waiting for the worker to have none
        size, short = 1, False
        started = self._clock.now()
        try:
            while True:
                if not in_flight:
                    job, held = held, None
                    if job is None:
                        try:
                            job = self._jobs_out.receive_nowait()
                        except anyio.WouldBlock:
                            try:
                                job = await self._jobs_out.receive()
                            except anyio.EndOfStream:
                                return
                            size = 1  # the queue ran dry: what comes may be another kind
                        except anyio.EndOfStream:
                            return
                    if not self._alive(worker):
                        # It died while idle (killed, its exec gone, the OOM killer): the
                        # job never reached it, and goes to its replacement.
                        log.warning("a %s died while idle; replacing it", self.worker_word)
                        self._requeue([Call([job])])
                        del job
                        await self._retire(worker)
                        return
                    held = await self._submit(worker, in_flight, job, size)
                    del job
                    started = self._clock.now()
                while held is None and self._may_add(in_flight, size, short):
                    try:
                        job = self._jobs_out.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    held = await self._submit(worker, in_flight, job, size)
                    del job
                if not in_flight:
                    continue
                # No local names a settled call: its jobs, their contents and replies, must
                # not stay alive here until the next job comes (a model can be hundreds of MB).
                remaining = in_flight[0].expires_at - self._clock.now()
                try:
                    with self._clock.move_on_after(remaining) as deadline:
                        collected = await self._collect(worker, in_flight)
                except CallFailed as failed:
                    self._failed(in_flight.popleft(), f"the task failed: {failed}")
                    continue
                except WorkerDied as died:
                    self._died(in_flight, f"the ClientApp crashed: {died}")
                    await self._retire(worker)
                    return
                if deadline.cancelled_caught:
                    self._overran(in_flight.popleft())
                    self._requeue(in_flight)  # behind a call still running: not started
                    in_flight.clear()
                    await self._retire(worker)
                    return
                now = self._clock.now()
                seconds = collected.seconds
                if seconds is None:
                    seconds, started = now - started, now
                short = seconds < self.short_task * max(collected.ran, 1)
                if not short:
                    size = 1
                elif collected.whole:
                    size = min(size * 2, self.max_batch)
                else:
                    size = max(collected.ran, 1)
        finally:
            if held is not None:  # the worker is gone, or the run ends: it goes back in line
                with contextlib.suppress(anyio.ClosedResourceError):
                    self._jobs_in.send_nowait(held)

    def _may_add(self, in_flight: deque[Call], size: int, short: bool) -> bool:
        """Whether another call may go behind those ``in_flight``: while tasks are short,
        up to :attr:`pipeline_depth` (of growing batches, or of single jobs where a
        call is one job), within :attr:`pipeline_bytes`, and never behind a job
        running alone."""
        if in_flight and in_flight[-1].jobs[0].alone:
            return False
        deep = size > 1 or (short and self.max_batch == 1)
        if len(in_flight) >= (self.pipeline_depth if deep else 1):
            return False
        if self.pipeline_bytes < math.inf:
            queued = sum(len(job.task) for call in in_flight for job in call.jobs)
            return queued < self.pipeline_bytes
        return True

    async def _submit(self, worker: W, in_flight: deque[Call], job: Job, size: int) -> Job | None:
        """Send ``job`` and up to ``size - 1`` more of the queue to ``worker`` in one call.

        A job that is to run alone goes in a call of its own, with no other call in
        flight on the worker: then a death while it runs is its doing. Met while
        other calls are in flight, it ends the filling and is returned, to be held
        until they are done.
        """
        jobs: list[Job] = []
        held: Job | None = None
        while True:
            if job.message.metadata.expires_at <= self._clock.now():
                job.fail(
                    ErrorCode.MESSAGE_UNAVAILABLE,
                    f"the message expired before {_a(self.worker_word)} was free",
                )
            elif job.alone:
                if jobs or in_flight:
                    held = job
                else:
                    await self._send(worker, in_flight, [job])
                break
            else:
                jobs.append(job)
                if len(jobs) >= size:
                    break
            try:
                job = self._jobs_out.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        if jobs:
            await self._send(worker, in_flight, jobs)
        return held

    def _failed(self, call: Call, reason: str) -> None:
        """Answer a call that failed on fedcore's side of its worker: its one job with
        code 2; a batch's jobs go back to the queue to run alone, so the one that fails
        is found."""
        if len(call.jobs) == 1:
            call.jobs[0].fail(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason)
            return
        log.warning("%s, in a batch of %d tasks; they run again, one per call", reason,
                    len(call.jobs))  # fmt: skip
        self._requeue([call], alone=True)

    def _died(self, in_flight: deque[Call], reason: str) -> None:
        """Answer the calls in flight on a worker that died (see the module's docstring)."""
        first = in_flight[0].jobs
        if len(first) == 1 and (self.exact_deaths or len(in_flight) == 1):
            in_flight.popleft()
            first[0].fail(ErrorCode.CLIENT_APP_CRASHED, reason)
            self._requeue(in_flight)
            in_flight.clear()
            return
        count = sum(len(call.jobs) for call in in_flight)
        log.warning("%s, with %d tasks in flight; they run again, one per call", reason,
                    count)  # fmt: skip
        self._requeue(in_flight, alone=True)
        in_flight.clear()

    def _overran(self, call: Call) -> None:
        """Answer the jobs of a call still running when a TTL ran out: those past their
        TTL with code 3; the others of a batch go back to the queue to run alone."""
        word = self.worker_word
        if len(call.jobs) == 1:
            reason = (
                f"the ClientApp was still running when the message's TTL of "
                f"{call.jobs[0].message.metadata.ttl:g} s ran out; its {word} was stopped"
            )
            call.jobs[0].fail(ErrorCode.MESSAGE_UNAVAILABLE, reason)
            return
        now = self._clock.now()
        for job in call.jobs:
            metadata = job.message.metadata
            if metadata.expires_at <= now:
                reason = (
                    f"the message's TTL of {metadata.ttl:g} s ran out while its {word} ran a "
                    f"batch of {len(call.jobs)} tasks; the {word} was stopped"
                )
                job.fail(ErrorCode.MESSAGE_UNAVAILABLE, reason)
            else:
                self._requeue([Call([job])], alone=True)

    def _requeue(self, calls: Iterable[Call], *, alone: bool = False) -> None:
        """Put the jobs of ``calls`` back in line, to run alone if ``alone``."""
        for call in calls:
            for job in call.jobs:
                job.alone = job.alone or alone
                self._jobs_in.send_nowait(job)


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
