"""The simulation engine: a ServerApp, N virtual nodes and a backend, on one event loop.

The ServerApp runs as a task; its Grid talks to an in-memory LinkState. A
dispatcher subscribes to the state's "message available" notifications and, for
each node with work, runs one task that pulls the node's messages and hands them,
one at a time and in order, to the backend with the node's Context — the way a
real node serves its messages. Replies go back into the state, which wakes the
Grid. Nothing polls.

A node is a row in the state plus, once it first receives a message, a Context:
registering 100,000 nodes costs their ids, not 100,000 Contexts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from fedcore.apps.server_app import ServerApp
from fedcore.clock import Clock
from fedcore.domain import SERVER_NODE_ID, Context, Message, RecordDict, Run, RunStatus
from fedcore.errors import StateError
from fedcore.simulation.backends.base import Backend
from fedcore.state.base import LinkState
from fedcore.transport.inproc.grid import InProcGrid

log = logging.getLogger(__name__)


@dataclass
class SimulationResult:
    """What a simulation returns: ``value`` is whatever ``main`` returned."""

    value: Any
    context: Context
    seed: int


class SimulationEngine:
    """Runs one ServerApp against ``num_nodes`` virtual nodes served by ``backend``."""

    def __init__(self, state: LinkState, backend: Backend, clock: Clock) -> None:
        self._state = state
        self._backend = backend
        self._clock = clock
        self._partitions: dict[int, int] = {}
        self._contexts: dict[int, Context] = {}
        self._busy: set[int] = set()
        self._renotified: set[int] = set()

    async def run(
        self, server: ServerApp, *, num_nodes: int, run_config: dict[str, Any], seed: int
    ) -> SimulationResult:
        node_ids = await self._state.create_nodes(num_nodes, heartbeat_interval=math.inf)
        self._partitions = {node_id: index for index, node_id in enumerate(node_ids)}
        run = await self._state.create_run(run_config, seed=seed)
        await self._state.update_run_status(run.run_id, RunStatus.STARTING)
        await self._state.update_run_status(run.run_id, RunStatus.RUNNING)
        context = Context(run.run_id, SERVER_NODE_ID, {}, RecordDict(), dict(run_config))
        failure: Exception | None = None
        async with anyio.create_task_group() as task_group:
            await task_group.start(self._dispatch, run, task_group)
            try:
                value = await server.run(InProcGrid(self._state, run, self._clock), context)
            except Exception as exc:
                failure = exc
            task_group.cancel_scope.cancel()
        if failure is not None:
            await self._state.update_run_status(
                run.run_id, RunStatus.FAILED, f"{type(failure).__name__}: {failure}"
            )
            raise failure
        await self._state.update_run_status(run.run_id, RunStatus.COMPLETED)
        return SimulationResult(value, context, seed)

    async def _dispatch(
        self, run: Run, task_group: TaskGroup, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        wake = anyio.Event()
        waiting: set[int] = set()

        def on_message(node_id: int) -> None:
            if node_id in self._busy:
                self._renotified.add(node_id)
                return
            waiting.add(node_id)
            wake.set()

        with self._state.watch_messages(on_message):
            task_status.started()
            while True:
                await wake.wait()
                wake = anyio.Event()
                ready, waiting = waiting, set()
                for node_id in ready:
                    self._busy.add(node_id)
                    task_group.start_soon(self._serve, run, node_id)

    async def _serve(self, run: Run, node_id: int) -> None:
        """Work through a node's messages in order; exit when it has none left.

        A notification that arrives while this task is busy is remembered in
        ``_renotified``, so a message stored during the last pull is not stranded.
        """
        try:
            while True:
                self._renotified.discard(node_id)
                messages = await self._state.pull_messages(node_id, limit=1)
                if not messages:
                    if node_id in self._renotified:
                        continue
                    return
                await self._deliver(run, node_id, messages[0])
        finally:
            self._busy.discard(node_id)

    async def _deliver(self, run: Run, node_id: int, message: Message) -> None:
        context = self._contexts.get(node_id) or self._new_context(run, node_id)
        reply, self._contexts[node_id] = await self._backend.run(message, context)
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
