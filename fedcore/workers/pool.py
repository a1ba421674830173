"""The process-pool backend: ClientApps in long-lived worker processes.

Entering the backend starts ``N`` workers (:mod:`.sizing`; each with its thread caps,
:mod:`.threads`), each importing the ClientApp once and saying hello; a ClientApp that
fails to import ends the simulation right there with one line. The scheduler
(:mod:`.scheduler`) sends each worker one job per call, pipelined up to
:data:`PIPELINE_DEPTH` while tasks are short, so that the next task already waits in
its socket and the engine reads several outcomes per wake-up. Nothing polls: a driver
waits for its channel to become readable.

The engine's end of each channel is a non-blocking socket read and written on the
event loop (:class:`_Channel`); only the worker's end is a blocking
``multiprocessing`` Connection. A blocking Connection on the loop would either stall
it or — once the loop has put the socket in non-blocking mode to watch it, as uvloop
does — give up halfway through a frame. Jobs in flight to one worker never add up to
more than :data:`PIPELINE_BYTES`, well under a socket's buffer, so a driver's write
always completes even while its worker is itself blocked writing outcomes.

Payloads cross by the channel when small. A large message content is written once
into a shared-memory segment that every task carrying that same content names —
the model a round sends to 500 nodes is written once, not 500 times — and is
unlinked when the content object is garbage-collected. A content already in a
segment of the backend's space (a node received it there: ``space`` is then the
node's, and the backend works in a subspace of it) is not written at all: the task
names that segment. A large reply comes back the same way: the worker writes a
segment, the engine maps it and unlinks it at once, and the reply's arrays are
views of that mapping, released with them.

Failures. A ClientApp exception is the worker's business: it answers with an error
reply (code 2). A worker that dies (a segfault, ``os._exit``, the OOM killer) shows
as end-of-file on its channel, after the outcomes it sent: the job it was running is
the first in flight, answered with code 8 (the scheduler's exact deaths), and a
replacement starts. Leaving the backend — after success, an exception, Ctrl-C or
cancellation — stops every worker (killing at once those still running a task, whose
reply nobody would read, and the others if they do not finish in time) and unlinks
every segment. Entering it unlinks the segments of pools whose process is
gone (it was killed before it could leave its backend).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio

from fedcore.clock import Clock
from fedcore.domain import Context, Message, RecordDict
from fedcore.errors import AppLoadError
from fedcore.wire import MAX_VALUE_LEN, DecodeLimits, parts_size
from fedcore.wire.records import bulk_bytes
from fedcore.wire.worker import (
    HELLO,
    Deframer,
    failure_reason,
    framed,
    pack_pointer,
    pack_release,
    pack_spec,
    pack_task,
    pointer_target,
    unpack_outcome,
)
from fedcore.workers.scheduler import Call, Collected, Job, WorkerBackend, WorkerDied
from fedcore.workers.shared_memory import SegmentSpace, map_segment, remove_stale
from fedcore.workers.sizing import PoolPlan
from fedcore.workers.spawn import Spawn, spawn_local
from fedcore.workers.threads import thread_defaults
from fedcore.workers.worker import WORKER_ENV, WorkerSpec

log = logging.getLogger(__name__)

INLINE_LIMIT = 64 * 1024
"""Payloads up to this size go through the channel; larger ones through shared memory."""
PIPELINE_DEPTH = 4
"""Jobs a worker may have in flight when its tasks are short: the one it runs and the
next ones, waiting in its socket."""
PIPELINE_BYTES = INLINE_LIMIT
"""More jobs go to a worker only while those in flight add up to less than this; as a
task is at most :data:`INLINE_LIMIT` bytes, in flight stays under twice that."""
SHORT_TASK = 0.005
"""Seconds under which a task counts as short. A worker whose tasks take longer gets one
job at a time, so that a quick job never waits behind a slow one while another worker
is free; for short tasks, the round trips saved by pipelining are what count."""
START_TIMEOUT = 300.0
"""Seconds a worker may take to import the ClientApp and run its lifespan's setup."""
STOP_GRACE = 5.0
"""Seconds workers get to finish their task and lifespan when the backend closes normally."""
SPAWN_THREADS = 8
"""Threads of the backend's own that start workers, at most. Never anyio's: a worker asks
Linux to kill it when its parent goes (``PR_SET_PDEATHSIG``), and the parent it means is
the *thread* that started it — anyio retires a thread idle for 10 s, which would take a
healthy worker with it. The backend's threads live until its workers have stopped."""


class _Channel:
    """The engine's end of a worker's socket: whole messages, without blocking the loop."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._socket = sock
        self._deframer = Deframer()

    async def send(self, *messages: bytes) -> None:
        """Write ``messages``; ``OSError`` if the worker has gone."""
        data = memoryview(framed(*messages))
        while data:
            try:
                data = data[self._socket.send(data) :]
            except BlockingIOError:
                await anyio.wait_writable(self._socket)

    async def receive(self) -> list[bytes]:
        """Wait for at least one whole message; return every one that has arrived.
        ``EOFError`` once the worker has gone."""
        while True:
            await anyio.wait_readable(self._socket)
            try:
                data = self._socket.recv(1 << 18)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                raise EOFError
            messages = self._deframer.feed(data)
            if messages:
                return messages

    def close(self) -> None:
        """Close the socket (the worker sees end-of-file); call it once no task waits on it."""
        self._socket.close()


class _Worker:
    """One worker process, the engine's end of its channel, and its outcome segments.

    ``releases`` collects the names of outcome segments the engine has stopped
    reading; finalizers append to it from whatever thread collects the arrays, and
    the driver sends them to the worker before its next job.
    """

    def __init__(self, spec: WorkerSpec, plan: PoolPlan, spawn: Spawn) -> None:
        self.index = spec.index
        self.segment_prefix = spec.segment_prefix
        self.releases: deque[str] = deque()
        self.in_flight: deque[Call] = deque()
        ours, theirs = socket.socketpair()
        environment = {**plan.environment(spec.index), WORKER_ENV: "1"}
        with theirs:
            self.process = spawn(theirs, environment, thread_defaults(plan.threads))
        ours.sendall(framed(pack_spec(spec.as_dict())))  # small: fits the socket's buffer
        self.channel = _Channel(ours)

    async def receive(self) -> list[bytes]:
        """Every message that has arrived, once at least one has; ``WorkerDied`` at its end."""
        try:
            return await self.channel.receive()
        except (EOFError, OSError):
            raise WorkerDied(await self.exit_description()) from None

    async def send(self, payload: bytes) -> None:
        """Send a job, after the releases that have piled up since the last one."""
        releases = [pack_release(self.releases.popleft()) for _ in range(len(self.releases))]
        await self.channel.send(*releases, payload)

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
        self.channel.close()


class ProcessPoolBackend(WorkerBackend["_Worker"]):
    """Runs a ClientApp, imported by ``client_ref``, in a pool of worker processes.

    ``private_memory``: each worker makes itself non-dumpable before it imports the
    ClientApp (:mod:`fedcore.non_dumpable`), as a deployed node's do; a simulation's
    workers, the user's own code, stay open to the user's debuggers.
    """

    start_timeout = START_TIMEOUT
    pipeline_depth = PIPELINE_DEPTH
    pipeline_bytes = PIPELINE_BYTES
    short_task = SHORT_TASK
    exact_deaths = True  # its outcomes arrive in order, and are read before end-of-file

    def __init__(
        self,
        client_ref: str,
        search_path: Path,
        plan: PoolPlan,
        clock: Clock,
        *,
        inline_limit: int = INLINE_LIMIT,
        space: SegmentSpace | None = None,
        spawn: Spawn = spawn_local,
        max_value_len: int = MAX_VALUE_LEN,
        private_memory: bool = False,
    ) -> None:
        super().__init__(clock)
        self._client_ref = client_ref
        self._private_memory = private_memory
        self._search_path = search_path
        self._plan = plan
        self._inline_limit = inline_limit
        self._space = SegmentSpace() if space is None else space.subspace()
        self._spawn = spawn
        self._workers: set[_Worker] = set()
        self._retired: set[_Worker] = set()
        self._spawner: ThreadPoolExecutor | None = None
        self._started = 0
        self._limits = DecodeLimits(max_value_len=max_value_len)

    @property
    def concurrency(self) -> int:
        """Jobs worth having in hand: enough to keep every worker's pipeline full."""
        return self._plan.workers * PIPELINE_DEPTH

    async def _prepare(self) -> None:
        stale = await anyio.to_thread.run_sync(remove_stale, self._space.root)
        if stale:
            log.warning("removed %d shared-memory segments of fedcore processes now gone", stale)
        self._spawner = ThreadPoolExecutor(
            min(self._plan.workers, SPAWN_THREADS), thread_name_prefix="fedcore-spawn"
        )

    async def _start_workers(self) -> None:
        async with anyio.create_task_group() as starting:
            for index in range(self._plan.workers):
                starting.start_soon(self._start_worker, index)

    def _log_started(self) -> None:
        log.info("process pool: %d workers", self._plan.workers)

    def _too_slow(self) -> str:
        return f"the ClientApp's workers did not start within {self.start_timeout:g} s"

    async def _stop_workers(self, *, clean: bool) -> None:
        grace = STOP_GRACE if clean else 0.0
        workers = [*self._workers, *self._retired]
        await anyio.to_thread.run_sync(_stop, workers, grace)
        if self._spawner is not None:
            self._spawner.shutdown()  # its threads are idle: the workers are gone
            self._spawner = None
        self._workers.clear()
        self._retired.clear()
        self._space.remove_all()

    async def _job(self, message: Message, context: Context) -> Job:
        return Job(message, self._task(message, context))

    # Workers ------------------------------------------------------------------------

    async def _start_worker(self, index: int) -> None:
        self._started += 1
        spec = WorkerSpec.here(
            index=index,
            client_ref=self._client_ref,
            search_path=str(self._search_path),
            segment_root=str(self._space.root),
            segment_prefix=f"{self._space.prefix}w{self._started}-",
            inline_limit=self._inline_limit,
            max_value_len=self._limits.max_value_len,
            private_memory=self._private_memory,
        )
        spawner = self._spawner
        assert spawner is not None
        with anyio.CancelScope(shield=True):  # once started, a worker is ours to stop
            started = spawner.submit(_Worker, spec, self._plan, self._spawn)
            worker = await anyio.to_thread.run_sync(started.result)
            self._workers.add(worker)
        try:
            (hello, *_) = await worker.receive()
        except WorkerDied as died:
            raise AppLoadError(f"a worker died while loading the ClientApp: {died}") from None
        reason = failure_reason(hello)
        if reason is not None:
            raise AppLoadError(reason)
        if hello != HELLO:
            raise AppLoadError(f"a worker said {hello[:40]!r} instead of hello")
        assert self._task_group is not None
        self._task_group.start_soon(self._drive, worker, name=f"worker-{index}-driver")

    def _alive(self, worker: _Worker) -> bool:
        return worker.process.poll() is None

    async def _send(self, worker: _Worker, in_flight: deque[Call], jobs: list[Job]) -> None:
        in_flight.append(Call(jobs))
        with contextlib.suppress(OSError):  # a worker that is gone shows in the next receive
            for job in jobs:
                await worker.send(job.task)

    async def _collect(self, worker: _Worker, in_flight: deque[Call]) -> Collected:
        outcomes = await worker.receive()
        for data in outcomes:
            (job,) = in_flight.popleft().jobs
            self._settle(worker, job, data)
            del job
        return Collected(len(outcomes))

    def _settle(self, worker: _Worker, job: Job, data: bytes) -> None:
        segment = pointer_target(data)
        if segment is None:
            job.settle(*unpack_outcome(data, self._limits))
            return
        mapped = map_segment(self._space.root / segment, take=False)
        # The worker may write over the segment once nothing here reads it any more.
        weakref.finalize(mapped, worker.releases.append, segment)
        job.settle(*unpack_outcome(memoryview(mapped), self._limits))

    async def _retire(self, worker: _Worker) -> None:
        worker.kill()
        worker.close()
        self._workers.discard(worker)
        self._retired.add(worker)
        await anyio.to_thread.run_sync(worker.process.wait)
        self._retired.discard(worker)
        self._space.remove_all(worker.segment_prefix)  # mappings of them stay valid
        try:
            await self._start_worker(worker.index)
        except AppLoadError as exc:
            log.error("could not replace worker %d: %s", worker.index, exc)
            if not self._workers:
                self._abandon_queued(f"no worker is left to run the ClientApp: {exc}")

    # Payloads -----------------------------------------------------------------------

    def _task(self, message: Message, context: Context) -> bytes:
        parts = pack_task(message, context, content_segment=self._content_segment(message.content))
        if parts_size(parts) <= self._inline_limit:
            return b"".join(parts)
        return pack_pointer(self._space.write(parts))

    def _content_segment(self, content: RecordDict) -> str | None:
        """The segment holding ``content``, written on first use; ``None`` if it is small."""
        held = self._space.content_segment(content)
        if held is not None:
            return held
        if bulk_bytes(content) <= self._inline_limit // 2:
            return None
        return self._space.write_content(content)


def _stop(workers: list[_Worker], grace: float) -> None:
    """Kill every worker still running a task (the run ended: its reply has no reader),
    close every channel (an idle worker exits at end-of-file, after its lifespan), wait
    ``grace`` s, then kill those left."""
    for worker in workers:
        if worker.in_flight:
            worker.kill()
        worker.close()
    deadline = time.monotonic() + grace
    for worker in workers:
        try:
            worker.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.process.wait()
