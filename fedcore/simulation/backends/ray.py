"""The Ray backend: ClientApps in long-lived Ray actors, on one machine or a cluster.

Theory of operation. Entering the backend opens the Ray it runs on
(:mod:`.ray_cluster`: the address given, ``$RAY_ADDRESS``, or a Ray of its own),
counts the actors of the ClientApp's ``Resources`` its nodes can place, and creates
them (:mod:`.ray_actor`), each with ``num_cpus`` and ``num_gpus`` as Ray reserves them
— a fraction of a GPU shares a device, Ray setting each actor's
``CUDA_VISIBLE_DEVICES`` — and the thread caps of :mod:`fedcore.workers.threads`, which the actor
sets itself before anything loads numpy (not a ``runtime_env``, which would cost each
actor a worker process started for it). Each actor imports the ClientApp and runs its
lifespan's setup once; one that fails to import ends the simulation right there with
its one line.

The scheduler (:mod:`fedcore.workers.scheduler`) sends each actor its jobs in batches —
several tasks in one actor call, as one Ray call costs more than a small ClientApp's
whole task — growing up to :data:`MAX_BATCH` jobs, with :data:`PIPELINE_DEPTH` calls in
flight, while the actor times its tasks under :data:`SHORT_TASK` each; so long tasks
(real training) spread over the actors one by one. The actor ends a batch early when it
has run long or its replies grew large (:mod:`.ray_tasks`): the jobs it left go back to
the queue. A task is the worker protocol's bytes (:mod:`fedcore.wire.worker`); a content
whose arrays are large goes into the object store once (``ray.put``, off the event loop)
and every task that carries it — a round's model, sent to every sampled node — refers to
that one object, passed once per call, which Ray frees once the content is
garbage-collected and its last task is done. Outcomes come back as one ``uint8`` array
of msgpack frames per call: on the driver's node Ray hands a large one over as a view of
its shared memory, and the replies' arrays are views of that, so replies cost their own
size (a batch's at most ``BATCH_BYTES`` and one more reply, together), until the
strategy has folded them in and let them go. Nothing of the app's is pickled either way.

The app reaches every node. Run on a cluster (an address), an app directory target
is the Ray job's working directory: Ray ships it to each node (``.gitignore`` and
``.rayignore`` leave files out) and the actors start in their node's copy, importing
the app from there. A ``module:attr`` target or an ``App`` object is imported by its
module name, which every node must then be able to import (installed there, or on a
shared file system); the engine's ``sys.path`` comes along, as it does to the
process backend's workers. So does it on a Ray of the run's own, where the app is
already, and on a Ray this process connected to itself (the job is its own, its
working directory too).

Failures. A ClientApp exception is the actor's business: it answers that message with
an error reply (code 2), and the rest of its batch runs on. An actor that dies —
killed, its process crashed, its node gone — while it had one job in flight answers
that job with code 8, and a replacement is created wherever Ray can place it. (An
actor that dies while idle costs the next call sent to it too: Ray says nothing of a
death until a task finds it.) An actor that dies with more in flight — a batch, or
calls queued behind one — says nothing of which job it was running, and the outcomes
of those it had finished die with it (even those of a call that had returned, whose
reply had not left the process yet): every job it had goes back to the queue to run
again alone, one per call with nothing else in flight on its actor, so that a job
that kills its actor again is the one answered with code 8 and no other job is. A
death from outside — the OOM killer, a lost node — then costs no reply at all; a job
that had finished runs its ClientApp twice, and only the second run's reply and state
are kept. A call still running when a message's TTL runs out gets its actor killed and
replaced: its one job is answered with code 3; of a batch, the jobs whose TTL has run
out are answered with code 3 and the others run again alone; the calls behind it had
not started and go back to the queue as they were. Leaving the backend — after
success, an exception, Ctrl-C or cancellation — kills every actor (after its
lifespan's teardown, when the run ended normally), then closes the Ray session; a Ray
of the run's own stops with its processes.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import ray

from fedcore.clock import Clock
from fedcore.domain import Context, Message, RecordDict
from fedcore.errors import AppLoadError, ResourceError
from fedcore.simulation.backends.ray_actor import ClientActor
from fedcore.simulation.backends.ray_cluster import (
    RaySession,
    close_session,
    cluster_nodes,
    open_session,
    plan_actors,
)
from fedcore.simulation.backends.ray_tasks import STORED
from fedcore.simulation.resources import Resources
from fedcore.wire import MAX_VALUE_LEN, DecodeLimits, pack_recorddict_parts
from fedcore.wire.records import bulk_bytes
from fedcore.wire.worker import pack_task, unpack_outcome, unpack_outcomes
from fedcore.workers.scheduler import (
    Call,
    CallFailed,
    Collected,
    Job,
    WorkerBackend,
    WorkerDied,
)
from fedcore.workers.threads import THREAD_VARIABLES, thread_count
from fedcore.workers.worker import WORKER_ENV

log = logging.getLogger(__name__)

STORE_THRESHOLD = 64 * 1024
"""A content whose arrays add up to more bytes than this goes into the object store
once; a smaller one travels inside each task (Ray itself inlines objects under 100 KiB)."""
MAX_BATCH = 32
"""Jobs an actor gets in one call at most, while its tasks are short."""
PIPELINE_DEPTH = 2
"""Calls an actor may have in flight while its tasks are short."""
SHORT_TASK = 0.005
"""Seconds per task (as the actor times them) under which tasks count as short, and
batches grow."""
START_TIMEOUT = 300.0
"""Seconds an actor may take to be placed, import the ClientApp and run its lifespan's setup."""
STOP_GRACE = 5.0
"""Seconds actors get to run their lifespan's teardown when the run ends normally."""
_NODES_SHOWN = 8


@dataclass(eq=False)
class _Actor:
    handle: Any
    node_id: str = ""
    pid: int = 0
    in_flight: deque[Call] = field(default_factory=deque)


@dataclass
class _Stored:
    """A content's object in the store, once its ``ray.put`` has finished."""

    ready: anyio.Event = field(default_factory=anyio.Event)
    ref: Any = None


class RayBackend(WorkerBackend["_Actor"]):
    """Runs a ClientApp, imported by ``client_ref``, in Ray actors sized by ``resources``."""

    start_timeout = START_TIMEOUT
    worker_name = "Ray actor"
    worker_word = "actor"
    max_batch = MAX_BATCH
    pipeline_depth = PIPELINE_DEPTH
    short_task = SHORT_TASK

    def __init__(
        self,
        client_ref: str,
        app_dir: Path | None,
        resources: Resources,
        clock: Clock,
        *,
        address: str | None = None,
        system: Resources | None = None,
        max_workers: int | None = None,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> None:
        super().__init__(clock)
        self._client_ref = client_ref
        self._app_dir = app_dir
        self._resources = resources
        self._address = address
        self._system = system
        self._max_workers = max_workers
        self._limits = DecodeLimits(max_value_len=max_value_len)
        self._session: RaySession | None = None
        self._count = 0
        self._actors: set[_Actor] = set()
        self._created: dict[int, Any] = {}  # every actor not yet killed, by id()
        self._stored: dict[int, _Stored] = {}
        self._ran: Counter[str] = Counter()
        self._names: dict[str, str] = {}
        self._options: dict[str, Any] = {}
        self._arguments: tuple[Any, ...] = ()

    @property
    def concurrency(self) -> int:
        """Jobs worth having in hand: enough to keep every actor's calls full."""
        return max(self._count, 1) * PIPELINE_DEPTH * MAX_BATCH

    async def _prepare(self) -> None:
        self._session = await open_session(self._address, self._system, self._app_dir)

    async def _start_workers(self) -> None:
        assert self._session is not None
        nodes = await cluster_nodes()
        self._names = _node_names(nodes)
        self._count = plan_actors(self._resources, nodes, self._max_workers)
        shipped = self._app_dir is not None and self._session.shipped == self._app_dir
        self._options, self._arguments = self._actor_setup(shipped=shipped)
        async with anyio.create_task_group() as starting:
            for _ in range(self._count):
                starting.start_soon(self._start_actor)

    def _log_started(self) -> None:
        hosts = len({actor.node_id for actor in self._actors})
        log.info("ray: %s on %s", _plural(self._count, "actor"), _plural(hosts, "node"))

    def _too_slow(self) -> str:
        return (
            f"the ClientApp's Ray actors did not start within {self.start_timeout:g} s "
            "(does the cluster have room for them, or do other jobs hold it?)"
        )

    async def _stop_workers(self, *, clean: bool) -> None:
        if clean:
            await self._stop_lifespans()
        for handle in self._created.values():
            ray.kill(handle, no_restart=True)
        self._created.clear()
        self._actors.clear()
        self._stored.clear()
        if self._ran:
            log.info("ray: %s", self._placement())
        if self._session is not None:
            session, self._session = self._session, None
            await close_session(session)

    async def _job(self, message: Message, context: Context) -> Job:
        content = await self._store(message.content)
        parts = pack_task(message, context, content_segment=None if content is None else STORED)
        return Job(message, b"".join(parts), content)

    # Actors -------------------------------------------------------------------------

    def _actor_setup(self, *, shipped: bool) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """The options actors are made with, and their arguments (those of
        :class:`ClientActor`); ``shipped`` when they start in Ray's copy of the app directory.

        A thread variable set here (where ``fedcore simulate`` runs) is passed on as it
        is; the others get the cap.
        """
        threads = str(thread_count(self._resources.num_cpus))
        environment = {name: os.environ.get(name) or threads for name in THREAD_VARIABLES}
        main = sys.modules.get("__main__")
        arguments = (
            {**environment, WORKER_ENV: "1"},
            self._client_ref,
            "" if shipped else str(self._app_dir or Path.cwd()),
            [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
            str(getattr(main, "__file__", "") or ""),
            self._limits.max_value_len,
        )
        options = {
            "num_cpus": self._resources.num_cpus,
            "num_gpus": self._resources.num_gpus,
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": 1,
        }
        return options, arguments

    async def _start_actor(self) -> None:
        def create() -> Any:
            return _actor_class().options(**self._options).remote(*self._arguments)

        with anyio.CancelScope(shield=True):  # once created, an actor is ours to kill
            handle = await anyio.to_thread.run_sync(create)
            self._created[id(handle)] = handle
        try:
            node_id, failure, pid = await handle.hello.remote()
        except ray.exceptions.RayError as exc:
            raise AppLoadError(
                f"a Ray actor died while loading the ClientApp: {_first(exc)}"
            ) from None
        if failure:
            raise AppLoadError(failure)
        actor = _Actor(handle, node_id, pid)
        self._actors.add(actor)
        assert self._task_group is not None
        self._task_group.start_soon(self._drive, actor, name=f"ray-actor-{pid}-driver")

    async def _send(self, actor: _Actor, in_flight: deque[Call], jobs: list[Job]) -> None:
        contents: dict[int, int] = {}  # each distinct object of the store once, by position
        references: list[Any] = []
        places = []
        for job in jobs:
            if job.content is None:
                places.append(-1)
                continue
            place = contents.setdefault(id(job.content), len(references))
            if place == len(references):
                references.append(job.content)
            places.append(place)
        tasks = [job.task for job in jobs]
        in_flight.append(Call(jobs, actor.handle.run.remote(tasks, places, *references)))

    async def _collect(self, actor: _Actor, in_flight: deque[Call]) -> Collected:
        """Settle the jobs of the first call that ran, in order, and queue again those
        the actor left unrun (it ends a batch early when it ran long or its replies grew
        large)."""
        try:
            outcome = await in_flight[0].ref
        except ray.exceptions.RayTaskError as exc:  # fedcore's side of the actor failed
            raise CallFailed(_first(exc)) from None
        except ray.exceptions.RayError as exc:
            raise WorkerDied(_first(exc)) from None
        batch = in_flight.popleft()
        views, seconds = unpack_outcomes(outcome.data)
        ran = min(len(views), len(batch.jobs))
        for job, view in zip(batch.jobs[:ran], views[:ran], strict=True):
            reply, state = unpack_outcome(view, self._limits)
            job.settle(reply, state)
            del reply, state
        for job in batch.jobs[ran:]:
            self._jobs_in.send_nowait(job)
        self._ran[actor.node_id] += ran
        return Collected(ran, whole=ran == len(batch.jobs), seconds=seconds)

    async def _retire(self, actor: _Actor) -> None:
        """Replace an actor that died or overran a TTL."""
        self._actors.discard(actor)
        ray.kill(actor.handle, no_restart=True)
        self._created.pop(id(actor.handle), None)
        try:
            with anyio.fail_after(START_TIMEOUT):
                await self._start_actor()
        except (AppLoadError, TimeoutError) as exc:
            log.error("ray: could not replace an actor: %s", exc or "it was not placed in time")
            if not self._actors:
                self._abandon_queued(f"no Ray actor is left to run the ClientApp: {exc}")

    async def _stop_lifespans(self) -> None:
        """Let each idle actor run its lifespan's teardown, for up to :data:`STOP_GRACE` s.

        An actor still running a batch when the run ended is not waited for: its
        outcomes have no reader, and it is killed with the others."""
        with anyio.move_on_after(STOP_GRACE):
            async with anyio.create_task_group() as stopping:
                for actor in self._actors:
                    if not actor.in_flight:
                        stopping.start_soon(_stop, actor)

    # Contents -----------------------------------------------------------------------

    async def _store(self, content: RecordDict) -> Any:
        """The object holding ``content`` in the store, put there on first use; ``None``
        for a content small enough to travel in each task."""
        entry = self._stored.get(id(content))
        if entry is None:
            if bulk_bytes(content) <= STORE_THRESHOLD:
                return None
            entry = self._stored[id(content)] = _Stored()
            try:
                entry.ref = await anyio.to_thread.run_sync(_put, content)
            except BaseException:
                del self._stored[id(content)]  # the next message of it tries again
                raise
            finally:
                entry.ready.set()
            weakref.finalize(content, self._stored.pop, id(content), None)
        await entry.ready.wait()
        if entry.ref is None:  # the put failed, and its message's runner says why
            return await self._store(content)
        return entry.ref

    def _placement(self) -> str:
        """Where the ClientApps ran: how many tasks on how many nodes, the busiest first."""
        busiest = self._ran.most_common()
        shown = ", ".join(
            f"{self._names.get(n, n[:12])} ×{count}" for n, count in busiest[:_NODES_SHOWN]
        )
        more = f", and {len(busiest) - _NODES_SHOWN} more" if len(busiest) > _NODES_SHOWN else ""
        runs, nodes = sum(self._ran.values()), _plural(len(busiest), "node")
        return f"{_plural(runs, 'ClientApp run')} on {nodes}: {shown}{more}"


async def _stop(actor: _Actor) -> None:
    try:
        await actor.handle.stop.remote()
    except ray.exceptions.RayError as exc:
        log.warning("ray: an actor's lifespan teardown failed: %s", _first(exc))


def _put(content: RecordDict) -> Any:
    """``content``'s frames as one ``uint8`` array in the object store."""
    data = np.frombuffer(b"".join(pack_recorddict_parts(content)), dtype=np.uint8)
    try:
        return ray.put(data)
    except ray.exceptions.ObjectStoreFullError as exc:
        raise ResourceError(
            f"Ray's object store has no room for a {data.nbytes} B content: {_first(exc)}"
        ) from None


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    """:class:`ClientActor` as a Ray actor class, made once per process."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(ClientActor)
    return _ACTOR_CLASS


def _node_names(nodes: list[Any]) -> dict[str, str]:
    """A name per node id for the logs: its own name, with its id's start where names repeat."""
    names = Counter(node.name for node in nodes)
    return {
        node.node_id: node.name if names[node.name] == 1 else f"{node.name} ({node.node_id[:8]})"
        for node in nodes
    }


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _first(exc: BaseException) -> str:
    """The first line of a Ray exception's text, which goes on with tracebacks."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
