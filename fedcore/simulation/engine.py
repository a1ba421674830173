"""The simulation engine: a ServerApp, N virtual nodes and a backend, on one event loop.

The ServerApp runs as a task; its Grid talks to an in-memory LinkState. A
dispatcher subscribes to the state's "message available" notifications and queues
each node with work; as many runner tasks as the backend can keep busy take nodes
from that queue, pull each node's messages and hand them, one at a time and in
order, to the backend with the node's Context — the way a real node serves its
messages. Replies go back into the state, which wakes the Grid. Nothing polls.

A node is a row in the state plus, once it first receives a message, a Context:
registering 100,000 nodes costs their ids, not 100,000 Contexts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from fedcore.apps.server_app import ServerApp
from fedcore.clock import Clock
from fedcore.domain import (
    SERVER_NODE_ID,
    Context,
    Error,
    ErrorCode,
    Message,
    RecordDict,
    Run,
    RunStatus,
)
from fedcore.errors import CheckpointError, StateError, ValueTooLargeError
from fedcore.state.base import LinkState
from fedcore.transport.grid import LinkGrid
from fedcore.wire import MAX_VALUE_LEN
from fedcore.wire.records import check_value_sizes
from fedcore.workers.base import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunStarted:
    """A simulated run began; carried by its INFO log record as ``fedcore_run``.

    Progress displays write it as the header of the run's metrics; ``started`` is
    the run's creation time in seconds since the epoch.
    """

    run_id: int
    seed: int
    run_config: dict[str, Any]
    started: float


@dataclass
class SimulationResult:
    """What a simulation returns: ``value`` is whatever ``main`` returned; ``out`` is the
    run's results directory, if it kept one."""

    value: Any
    context: Context
    seed: int
    out: Path | None = None


class SimulationEngine:
    """Runs one ServerApp against ``num_nodes`` virtual nodes served by ``backend``."""

    def __init__(
        self,
        state: LinkState,
        backend: Backend,
        clock: Clock,
        *,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> None:
        self._state = state
        self._backend = backend
        self._clock = clock
        self._max_value_len = max_value_len
        self._partitions: dict[int, int] = {}
        self._contexts: dict[int, Context] = {}
        self._queued: set[int] = set()
        self._renotified: set[int] = set()
        self._ended = False

    async def run(
        self,
        server: ServerApp,
        *,
        num_nodes: int,
        run_config: dict[str, Any],
        seed: int,
        round_timeout: float | None = None,
        node_states: Mapping[int, RecordDict] | None = None,
    ) -> SimulationResult:
        """Run ``server``'s main to its end. ``node_states`` are contexts' states to start
        the nodes with (a resumed run's, by node id: the seed gives the same ids)."""
        node_ids = await self._state.create_nodes(num_nodes, heartbeat_interval=math.inf)
        self._partitions = {node_id: index for index, node_id in enumerate(node_ids)}
        run = await self._state.create_run(run_config, seed=seed)
        for node_id, node_state in (node_states or {}).items():
            if node_id not in self._partitions:
                raise CheckpointError(
                    f"the checkpoint holds a context of node {node_id}, which this run has "
                    "not: resume the run with the nodes and seed it was started with"
                )
            self._contexts[node_id] = dataclasses.replace(
                self._new_context(run, node_id), state=node_state
            )
        await self._state.update_run_status(run.run_id, RunStatus.STARTING)
        await self._state.update_run_status(run.run_id, RunStatus.RUNNING)
        context = Context(run.run_id, SERVER_NODE_ID, {}, RecordDict(), dict(run_config))
        started = RunStarted(run.run_id, seed, dict(run_config), run.created_at)
        log.info("run %d started, seed %d", run.run_id, seed, extra={"fedcore_run": started})
        failure: Exception | None = None
        async with anyio.create_task_group() as task_group:
            await task_group.start(self._dispatch, run)
            try:
                grid_run = dataclasses.replace(run, round_timeout=round_timeout)
                grid = LinkGrid.in_process(
                    self._state, grid_run, self._clock, max_value_len=self._max_value_len
                )
                value = await server.run(grid, context)
            except Exception as exc:
                failure = exc
            self._end()
            task_group.cancel_scope.cancel()
        if failure is not None:
            await self._state.update_run_status(
                run.run_id, RunStatus.FAILED, f"{type(failure).__name__}: {failure}"
            )
            raise failure
        await self._state.update_run_status(run.run_id, RunStatus.COMPLETED)
        return SimulationResult(value, context, seed)

    def node_states(self) -> dict[int, RecordDict]:
        """Each node's ``Context.state``, by node id, for nodes that have one (a round
        checkpoint's; called between rounds)."""
        return {node_id: context.state for node_id, context in self._contexts.items()}

    async def _dispatch(self, run: Run, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Queue each node with work once; ``backend.concurrency`` runners serve the queue.

        A node is queued when a message becomes available to it and stays queued
        until a runner finds it with nothing left, so one node's messages are served
        one at a time, in order. A notification that arrives while its node is being
        served is remembered (``_renotified``) so that a message stored during the
        runner's last pull is not stranded.
        """
        ready_in, ready_out = anyio.create_memory_object_stream[int](math.inf)

        def on_message(node_id: int) -> None:
            if node_id in self._queued:
                self._renotified.add(node_id)
                return
            self._queued.add(node_id)
            ready_in.send_nowait(node_id)

        with ready_in, ready_out, self._state.watch_messages(on_message):
            async with anyio.create_task_group() as runners:
                for _ in range(self._backend.concurrency):
                    runners.start_soon(self._runner, run, ready_out.clone())
                task_status.started()

    async def _runner(self, run: Run, ready: MemoryObjectReceiveStream[int]) -> None:
        with ready:
            async for node_id in ready:
                try:
                    await self._serve(run, node_id)
                finally:
                    self._queued.discard(node_id)

    async def _serve(self, run: Run, node_id: int) -> None:
        """Work through a node's messages in order, until it has none left.

        The node is pulled again only if a notification came in meanwhile.
        """
        while True:
            self._renotified.discard(node_id)
            for message in await self._state.pull_messages(node_id):
                await self._deliver(run, node_id, message)
            if node_id not in self._renotified:
                return

    def _end(self) -> None:
        """Start no more ClientApps, and say, once, what the run's end cancels: messages
        still in flight (a ServerApp whose ``main`` ends with a push it does not pull),
        whose ClientApps are stopped or never started, their replies having no reader.

        A runner the end's cancellation has not reached yet (it was already scheduled
        to resume) sees ``_ended`` before it hands the backend anything more.
        """
        self._ended = True
        if self._queued:
            log.info(
                "the run ended with messages in flight to %d nodes: their ClientApps are "
                "stopped or not started, and their replies dropped",
                len(self._queued),
            )

    async def _deliver(self, run: Run, node_id: int, message: Message) -> None:
        if self._ended:
            return
        context = self._contexts.get(node_id) or self._new_context(run, node_id)
        reply, self._contexts[node_id] = await self._backend.run(message, context)
        if message.metadata.expires_at <= self._clock.now():
            return  # the state answers an expired message itself (code 3)
        if reply.has_content():
            try:  # what a worker checks before sending, for the inline backend too
                check_value_sizes(reply.content, self._max_value_len)
            except ValueTooLargeError as exc:
                failed = Error(
                    int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION),
                    f"the reply could not be sent: {exc}",
                )
                reply = Message(error=failed, reply_to=message)
        try:
            await self._state.push_reply(node_id, reply)
        except StateError as exc:
            log.warning("reply from node %d dropped: %s", node_id, exc)

    def _new_context(self, run: Run, node_id: int) -> Context:
        node_config = {
            "partition-id": self._partitions[node_id],
            "num-partitions": len(self._partitions),
        }
        return Context(run.run_id, node_id, node_config, RecordDict(), dict(run.run_config))
