"""The process-pool backend: ClientApps in long-lived worker processes.

Theory of operation. Entering the backend spawns ``N`` workers (see
:mod:`.sizing`), each importing the ClientApp once and saying hello; a ClientApp
that fails to import ends the simulation right there with one line. Each call to
:meth:`ProcessPoolBackend.run` takes an idle worker (first come, first served —
so messages are served in about the order they were sent), sends it the task over
a pipe, waits for the pipe to become readable (no thread, no polling), and reads
the outcome.

Payloads cross by pipe when small. A large message content is written once into a
shared-memory segment that every task carrying that same content names — the
model a round sends to 500 nodes is written once, not 500 times — and is unlinked
when the content object is garbage-collected. A large reply comes back the same
way: the worker writes a segment, the engine maps it and unlinks it at once, and
the reply's arrays are views of that mapping, released with them.

Failures. A ClientApp exception is the worker's business: it answers with an error
reply (code 2). A worker that dies mid-task (a segfault, ``os._exit``, the OOM
killer) shows as end-of-file on its pipe: the task is answered with code 8 and a
replacement is started in the background. A task still running when its message's
TTL runs out gets its worker killed and replaced and is answered with code 3.
Leaving the backend — after success, an exception, Ctrl-C or cancellation — stops
every worker (killing those that do not finish in time) and unlinks every segment.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock
from fedcore.domain import Context, Error, ErrorCode, Message, RecordDict
from fedcore.errors import AppLoadError
from fedcore.simulation.backends.base import Backend
from fedcore.simulation.backends.shared_memory import SegmentSpace, map_segment
from fedcore.simulation.backends.sizing import PoolPlan
from fedcore.simulation.backends.worker import WORKER_ENV, WorkerSpec
from fedcore.wire import pack_recorddict_parts, parts_size
from fedcore.wire.worker import (
    HELLO,
    failure_reason,
    pack_pointer,
    pack_spec,
    pack_task,
    pointer_target,
    unpack_outcome,
)

log = logging.getLogger(__name__)

INLINE_LIMIT = 64 * 1024
"""Payloads up to this size go through the pipe; larger ones through shared memory."""
START_TIMEOUT = 300.0
"""Seconds a worker may take to import the ClientApp and run its lifespan's setup."""
STOP_GRACE = 5.0
"""Seconds workers get to finish their task and lifespan when the backend closes normally."""


_WORKER_MAIN = "import sys; from fedcore.simulation.backends.worker import main; main(sys.argv[1])"


class WorkerDied(Exception):
    """A worker's pipe reached end-of-file: the process is gone."""


class _Worker:
    """One worker process and the engine's end of its channel."""

    def __init__(self, spec: WorkerSpec, environment: dict[str, str]) -> None:
        self.index = spec.index
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_MAIN, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env={**os.environ, **environment, WORKER_ENV: "1"},
            )
        self.connection = Connection(ours.detach())
        self.connection.send_bytes(pack_spec(spec.as_dict()))

    async def receive(self) -> bytes:
        await anyio.wait_readable(self.connection.fileno())
        try:
            return self.connection.recv_bytes()
        except (EOFError, OSError):
            raise WorkerDied(await self.exit_description()) from None

    async def exchange(self, payload: bytes) -> bytes:
        try:
            self.connection.send_bytes(payload)
        except OSError:
            raise WorkerDied(await self.exit_description()) from None
        return await self.receive()

    async def exit_description(self) -> str:
        with anyio.move_on_after(1.0):
            await anyio.to_thread.run_sync(self.process.wait)
        code = self.process.returncode
        if code is None:
            return "its worker stopped answering"
        if code < 0:
            return f"its worker was killed by {signal.Signals(-code).name}"
        return f"its worker exited with status {code}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        self.connection.close()


class ProcessPoolBackend(Backend):
    """Runs a ClientApp, imported by ``client_ref``, in a pool of spawned workers."""

    def __init__(
        self,
        client_ref: str,
        search_path: Path,
        plan: PoolPlan,
        clock: Clock,
        *,
        inline_limit: int = INLINE_LIMIT,
    ) -> None:
        self._client_ref = client_ref
        self._search_path = search_path
        self._plan = plan
        self._clock = clock
        self._inline_limit = inline_limit
        self._space = SegmentSpace()
        self._workers: set[_Worker] = set()
        self._retired: set[_Worker] = set()
        self._idle_in, self._idle_out = anyio.create_memory_object_stream[_Worker](math.inf)
        self._contents: dict[int, tuple[weakref.ref[RecordDict], str]] = {}
        self._task_group: TaskGroup | None = None

    @property
    def workers(self) -> int:
        """How many workers the pool runs."""
        return self._plan.workers

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the workers alive now."""
        return [worker.process.pid for worker in self._workers]

    async def __aenter__(self) -> Self:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            with anyio.fail_after(START_TIMEOUT):
                async with anyio.create_task_group() as starting:
                    for index in range(self._plan.workers):
                        starting.start_soon(self._start_worker, index)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, BaseExceptionGroup):
                load_errors = exc.subgroup(AppLoadError)
                if load_errors is not None:
                    raise load_errors.exceptions[0] from None
            if isinstance(exc, TimeoutError):
                raise AppLoadError(
                    f"the ClientApp's workers did not start within {START_TIMEOUT:g} s"
                ) from None
            raise
        log.info("process pool: %d workers", self._plan.workers)
        return self

    async def _start_worker(self, index: int) -> None:
        spec = WorkerSpec.here(
            index=index,
            client_ref=self._client_ref,
            search_path=str(self._search_path),
            segment_root=str(self._space.root),
            segment_prefix=self._space.prefix,
            inline_limit=self._inline_limit,
        )
        worker = _Worker(spec, self._plan.environment(index))
        self._workers.add(worker)
        try:
            hello = await worker.receive()
        except WorkerDied as died:
            raise AppLoadError(f"a worker died while loading the ClientApp: {died}") from None
        reason = failure_reason(hello)
        if reason is not None:
            raise AppLoadError(reason)
        if hello != HELLO:
            raise AppLoadError(f"a worker said {hello[:40]!r} instead of hello")
        self._idle_in.send_nowait(worker)

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker that crashed, hung or was interrupted, and start its replacement."""
        worker.kill()
        worker.close()
        self._workers.discard(worker)
        self._retired.add(worker)
        if self._task_group is not None and not self._task_group.cancel_scope.cancel_called:
            self._task_group.start_soon(self._replace, worker)

    async def _replace(self, worker: _Worker) -> None:
        await anyio.to_thread.run_sync(worker.process.wait)
        self._retired.discard(worker)
        try:
            await self._start_worker(worker.index)
        except AppLoadError as exc:
            log.error("could not replace worker %d: %s", worker.index, exc)
            if not self._workers:
                self._idle_in.close()  # waiting callers learn that no worker is left

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
                grace = STOP_GRACE if exc_type is None else 0.0
                workers = [*self._workers, *self._retired]
                await anyio.to_thread.run_sync(_stop, workers, grace)
            self._workers.clear()
            self._retired.clear()
            self._idle_in.close()
            self._idle_out.close()
            self._space.remove_all()
            self._contents.clear()

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        payload = self._payload(message, context)
        try:
            worker = await self._idle_out.receive()
        except anyio.EndOfStream:
            reason = "no worker is left to run the ClientApp (replacements failed to start)"
            return _error(message, ErrorCode.CLIENT_APP_CRASHED, reason), context
        remaining = message.metadata.expires_at - self._clock.now()
        try:
            with self._clock.move_on_after(remaining) as deadline:
                data = await worker.exchange(payload)
        except WorkerDied as died:
            self._retire(worker)
            reason = f"the ClientApp crashed: {died}"
            return _error(message, ErrorCode.CLIENT_APP_CRASHED, reason), context
        except BaseException:
            self._retire(worker)
            raise
        if deadline.cancelled_caught:
            self._retire(worker)
            reason = (
                f"the ClientApp was still running when the message's TTL of "
                f"{message.metadata.ttl:g} s ran out; its worker was stopped"
            )
            return _error(message, ErrorCode.MESSAGE_UNAVAILABLE, reason), context
        self._idle_in.send_nowait(worker)
        segment = pointer_target(data)
        outcome = data if segment is None else map_segment(self._space.root / segment, take=True)
        reply, context.state = unpack_outcome(outcome)
        return reply, context

    def _payload(self, message: Message, context: Context) -> bytes:
        parts = pack_task(message, context, content_segment=self._content_segment(message.content))
        if parts_size(parts) <= self._inline_limit:
            return b"".join(parts)
        return pack_pointer(self._space.write(parts))

    def _content_segment(self, content: RecordDict) -> str | None:
        """The segment holding ``content``, written on first use; ``None`` if it is small."""
        cached = self._contents.get(id(content))
        if cached is not None and cached[0]() is content:
            return cached[1]
        parts = pack_recorddict_parts(content)
        if parts_size(parts) <= self._inline_limit:
            return None
        name = self._space.write(parts)
        self._contents[id(content)] = (weakref.ref(content), name)
        weakref.finalize(content, _forget, self._contents, id(content), self._space.root / name)
        return name


def _forget(contents: dict[int, tuple[weakref.ref[RecordDict], str]], key: int, path: Path) -> None:
    entry = contents.get(key)
    if entry is not None and entry[1] == path.name:
        del contents[key]
    path.unlink(missing_ok=True)


def _stop(workers: list[_Worker], grace: float) -> None:
    """Close every channel (a worker exits at end-of-file), wait ``grace`` s, then kill."""
    for worker in workers:
        worker.close()
    deadline = time.monotonic() + grace
    for worker in workers:
        try:
            worker.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.process.wait()


def _error(message: Message, code: ErrorCode, reason: str) -> Message:
    return Message(error=Error(int(code), reason), reply_to=message)
