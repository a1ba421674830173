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

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskGroup

from fedcore.domain import Context, Message
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
    """

    start_timeout: float = 300.0
    _task_group: TaskGroup | None = None

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
