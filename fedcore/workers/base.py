"""Backend: what runs a node's ClientApp for one message.

The simulation engine (for each virtual node) and a deployed node (for each run) hand
a backend one message at a time with the node's :class:`~fedcore.domain.Context`, and
get back the reply and the context to keep.
Returning the context (rather than relying on in-place changes) lets a backend run
the ClientApp in another process and ship ``context.state`` back. A backend is an
async context manager: entering it starts its workers (and imports the ClientApp
where it runs), leaving it stops them, whatever happened in between.

A backend never raises for the ClientApp's failures; it answers with an error
reply (code 2 when the app raised, 8 when its worker crashed).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup

from fedcore.domain import Context, Error, ErrorCode, Message, RecordDict
from fedcore.errors import AppLoadError


class Backend(ABC):
    """Runs ClientApps for the simulation engine or a node."""

    @property
    @abstractmethod
    def concurrency(self) -> int:
        """How many :meth:`run` calls this backend can usefully serve at once."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @abstractmethod
    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        """Handle ``message`` on the node that ``context`` describes; return reply and context."""


@dataclass(eq=False)
class Job:
    """One message on its way through a worker, and what came back.

    ``task`` is the message and its node's context in the worker protocol's bytes
    (:mod:`fedcore.wire.worker`); ``content`` what a backend keeps of the message's
    content beside them (Ray: its object in the store); ``alone``: it is to run in a
    call of its own (Ray: it was in a batch that failed as a whole).
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


class WorkerBackend(Backend):
    """A backend whose ClientApps run in workers it starts on entry and ends on exit.

    The process pool's worker processes and the Ray backend's actors share this
    lifecycle: entering prepares (:meth:`_prepare`), opens the task group the workers'
    drivers run in (:attr:`_task_group`), and starts the workers
    (:meth:`_start_workers`) within :attr:`start_timeout`; a failure on the way leaves
    nothing behind. A ClientApp that cannot be imported raises its
    :class:`~fedcore.errors.AppLoadError` (the first, not a group of them), and
    workers that do not start in time one saying so. Leaving cancels the drivers, then
    ends the workers (:meth:`_stop_workers`) shielded from cancellation, whatever
    ended the run.

    :meth:`run` queues each message as a :class:`Job` (:meth:`_job` makes it) and
    waits for it to be settled; the workers' drivers take jobs from the queue
    (:attr:`_jobs_out`) and put back (:attr:`_jobs_in`) those a worker did not run.
    Once no worker is left, every queued job and every later one is answered with
    code 8.
    """

    start_timeout: float = 300.0
    worker_name: str = "worker"
    """What the backend's workers are called in the replies that say none is left."""
    _task_group: TaskGroup | None = None

    def __init__(self) -> None:
        self._jobs_in, self._jobs_out = anyio.create_memory_object_stream[Job](math.inf)

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
