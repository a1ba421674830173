"""The runs a node serves: each one's app, loaded once, its ClientApp runner, and its Context.

The first message of a run loads it: the run from the link (``get_run``), its
bundle (downloaded once, unless cached; see :mod:`.bundles`), the ClientApp named
by the bundle's pyproject, and a runner built by the node's
:data:`~fedcore.roles.node.runner.RunnerFactory`. Messages of the run that arrive
meanwhile wait for that one load. A run whose app cannot be fetched, unpacked or
loaded is remembered as failed, and each of its messages is answered with error
code 1 (LOAD_CLIENT_APP_EXCEPTION) and the one-line reason; a link that is away
is waited for instead, with backoff.

Each run keeps one :class:`~fedcore.domain.Context`: ``node_config`` from the node,
``run_config`` from the run, and ``state``, which carries over from one message of
the run to the next (ClientApps are ephemeral, their state is not). To keep that
state consistent, a run's messages are handled one at a time, in the order they
arrive; messages of different runs run side by side.

A runner lives in a task of its own, so it starts and stops in one task whichever
message or sweep asked. It is stopped when its run has been idle for
``idle_timeout`` (the Context stays, and the next message starts a new runner),
and forgotten with its Context when the link reports the run finished. The node
asks about the runs it holds a runner for every heartbeat interval
(:meth:`RunCache.end_finished`), so a finished run's ClientApp process — hundreds
of megabytes once a framework is imported — ends then, not an idle timeout later.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio
import anyio.abc
import anyio.to_thread

from fedcore.clock import Clock
from fedcore.domain import Context, Error, ErrorCode, Message, RecordDict, Run, UserConfigValue
from fedcore.errors import FedcoreError, NotFoundError, RunFinishedError, RunNotFoundError
from fedcore.roles.node.bundles import client_reference, fetch_bundle
from fedcore.roles.node.retry import Retrier
from fedcore.roles.node.runner import ClientAppRunner, RunnerFactory
from fedcore.transport.fleet import FleetService

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Host:
    """A started runner, and how to stop the task that holds it."""

    runner: ClientAppRunner
    closing: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class _Run:
    run_id: int
    last_used: float
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    busy: int = 0
    """Messages handling or waiting to handle: a busy run is never stopped."""
    context: Context | None = None
    host: _Host | None = None
    failure: str | None = None
    """Why the run's app cannot be loaded, once it could not be."""


class RunCache:
    """Loads runs on first use and hands each message to its run's runner with its Context."""

    def __init__(
        self,
        fleet: FleetService,
        *,
        node_config: Mapping[str, UserConfigValue],
        cache_dir: Path,
        runner_factory: RunnerFactory,
        clock: Clock,
        retry: Retrier,
        idle_timeout: float,
    ) -> None:
        self._fleet = fleet
        self._node_config = dict(node_config)
        self._cache_dir = cache_dir
        self._factory = runner_factory
        self._clock = clock
        self._retry = retry
        self._idle_timeout = idle_timeout
        self._runs: dict[int, _Run] = {}
        self._hosts: set[_Host] = set()
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None
        for host in self._hosts:
            host.closing.set()
        self._runs.clear()
        task_group, self._task_group = self._task_group, None
        return await task_group.__aexit__(exc_type, exc, tb)

    async def handle(self, node_id: int, message: Message) -> Message:
        """The reply of ``message``'s run's ClientApp, or an error reply if it cannot run.

        Raises ``NotFoundError`` when the link does not know the node or the run
        (any more), and ``RunFinishedError`` for a run that has finished.
        """
        run_id = message.metadata.run_id
        entry = self._runs.get(run_id)
        if entry is None:
            entry = self._runs[run_id] = _Run(run_id, self._clock.now())
        entry.busy += 1
        try:
            async with entry.lock:
                if entry.host is None and entry.failure is None:
                    await self._load(entry, node_id)
                if entry.failure is not None:
                    error = Error(ErrorCode.LOAD_CLIENT_APP_EXCEPTION, entry.failure)
                    return Message(error=error, reply_to=message)
                return await self._run(entry, node_id, message)
        finally:
            entry.busy -= 1
            entry.last_used = self._clock.now()

    async def forget(self, run_id: int) -> None:
        """The run has finished: stop its runner and drop its Context (unless still busy)."""
        entry = self._runs.get(run_id)
        if entry is None:
            return
        async with entry.lock:
            if entry.busy or self._runs.get(run_id) is not entry:
                return
            del self._runs[run_id]
            await self._stop(entry)
        log.info("run %d has finished: its ClientApp and state are gone from this node", run_id)

    async def end_finished(self, node_id: int) -> None:
        """Forget the runs holding a runner that the link says have finished.

        Only a status the link reports counts: a run it does not know for this node
        (a link restarted since it handed out the run's messages) may be running
        still, and its Context must stay until the idle sweep.
        """
        for entry in list(self._runs.values()):
            if entry.busy or entry.host is None:
                continue
            if await self._finished(node_id, entry.run_id, unknown_is_finished=False):
                await self.forget(entry.run_id)

    async def sweep(self, node_id: int) -> None:
        """Stop the runners of runs idle for ``idle_timeout``; forget those that finished."""
        now = self._clock.now()
        for entry in list(self._runs.values()):
            if entry.busy or now - entry.last_used < self._idle_timeout:
                continue
            if await self._finished(node_id, entry.run_id):
                await self.forget(entry.run_id)
                continue
            async with entry.lock:
                if entry.busy or entry.host is None:
                    continue
                await self._stop(entry)
                entry.last_used = now
            log.info(
                "run %d has been idle for %g s: its ClientApp is stopped until its next message",
                entry.run_id,
                self._idle_timeout,
            )

    # Inside -----------------------------------------------------------------------------

    async def _load(self, entry: _Run, node_id: int) -> None:
        """Start the run's runner, or record why its app cannot load."""
        run_id = entry.run_id
        run, digest = await self._retry(lambda: self._fleet.get_run(node_id, run_id))
        if run.status.finished:
            raise RunFinishedError(f"run {run_id} has finished")
        try:
            app_dir = await self._retry(
                lambda: fetch_bundle(self._fleet, node_id, run_id, digest, self._cache_dir)
            )
            client_ref = await anyio.to_thread.run_sync(client_reference, app_dir)
            assert self._task_group is not None
            entry.host = await self._task_group.start(self._host, run, app_dir, client_ref)
        except NotFoundError:
            raise
        except Exception as exc:
            entry.failure = _one_line(exc)
            log.warning(
                "run %d: its app cannot be loaded, so its messages get error replies: %s",
                run_id,
                entry.failure,
            )
            return
        if entry.context is None:
            config = dict(run.run_config)
            entry.context = Context(run_id, node_id, dict(self._node_config), RecordDict(), config)
        log.info(
            "run %d: app loaded (ClientApp %s, bundle %s)",
            run_id,
            client_ref,
            digest.sha256.hex()[:12],
        )

    async def _host(
        self,
        run: Run,
        app_dir: Path,
        client_ref: str,
        *,
        task_status: anyio.abc.TaskStatus[_Host] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold a runner from start to stop; a failure to start goes to whoever asked."""
        host = _Host(self._factory(run, app_dir, client_ref))
        started = False
        try:
            async with host.runner:
                self._hosts.add(host)
                started = True
                task_status.started(host)
                await host.closing.wait()
        except Exception:
            if not started:
                raise
            log.exception("run %d: the ClientApp runner failed while stopping", run.run_id)
        finally:
            self._hosts.discard(host)
            host.closed.set()

    async def _run(self, entry: _Run, node_id: int, message: Message) -> Message:
        assert entry.host is not None
        assert entry.context is not None
        entry.context.node_id = node_id
        try:
            reply, entry.context = await entry.host.runner.run(message, entry.context)
        except Exception as exc:
            reason = f"the ClientApp runner of run {entry.run_id} broke: {_one_line(exc)}"
            log.warning("%s; it is restarted for the next message", reason)
            await self._stop(entry)
            return Message(error=Error(ErrorCode.CLIENT_APP_CRASHED, reason), reply_to=message)
        return reply

    async def _stop(self, entry: _Run) -> None:
        host, entry.host = entry.host, None
        if host is not None:
            host.closing.set()
            await host.closed.wait()

    async def _finished(
        self, node_id: int, run_id: int, *, unknown_is_finished: bool = True
    ) -> bool:
        """Whether the link says the run finished; ``False`` when it cannot say now.

        A run the link does not know (for this node) counts as finished unless
        ``unknown_is_finished`` is false.
        """
        try:
            run, _ = await self._fleet.get_run(node_id, run_id)
        except RunNotFoundError:
            return unknown_is_finished
        except FedcoreError:
            return False
        return run.status.finished


def _one_line(exc: Exception) -> str:
    """An exception as a reason a person reads: fedcore's own messages as they are."""
    text = str(exc) if isinstance(exc, FedcoreError) else f"{type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
