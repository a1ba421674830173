"""The link's side of the runtime API: a run's ServerApp process and its Grid.

:class:`LinkRuntime` implements :class:`~fedcore.transport.runtime.RuntimeService`
over the LinkState. Every call names its run, and the transport authenticates the
launch secret first (:meth:`LinkRuntime.authenticate`), so a ServerApp can only
touch its own run's messages, replies, context, log, metrics and artifacts. Waits are event-driven:
``get_node_ids`` with ``at_least`` sleeps on node notifications, ``pull_replies``
on reply notifications, each until its ``wait_seconds`` run out.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
from collections.abc import Sequence
from typing import Any

from fedcore.clock import Clock
from fedcore.domain import SERVER_NODE_ID, Message, RecordDict, Run, RunStatus
from fedcore.errors import InvalidTransitionError
from fedcore.state.base import LinkState
from fedcore.state.waiting import look_until
from fedcore.transport.runtime import RuntimeService

log = logging.getLogger(__name__)


class LinkRuntime(RuntimeService):
    """The runtime API over ``state``; waits follow ``clock``.

    Every request of a ServerApp authenticates, so a secret checked once is
    remembered (as its hash) with the run, until the state announces a change of
    that run — a new claim, a status — after which the next request checks again.
    That spares a database transaction per request without ever answering from a
    run's past.
    """

    def __init__(self, state: LinkState, clock: Clock) -> None:
        self._state = state
        self._clock = clock
        self._verified: dict[int, tuple[bytes, Run]] = {}
        self._changes = 0
        """Run changes announced so far: a check that saw one happen is not remembered."""
        self._subscription = state.watch_runs(self._forget)

    def _forget(self, run_id: int) -> None:
        self._verified.pop(run_id, None)
        self._changes += 1

    async def authenticate(self, run_id: int, secret: str) -> Run:
        digest = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
        known = self._verified.get(run_id)
        if known is not None and hmac.compare_digest(known[0], digest):
            return known[1]
        changes = self._changes
        run = await self._state.check_run_secret(run_id, secret)
        if self._changes == changes:  # no run moved while we checked
            self._verified[run_id] = (digest, run)
        return run

    async def heartbeat(self, run_id: int, heartbeat_interval: float) -> Run:
        return await self._state.heartbeat_run(run_id, heartbeat_interval=heartbeat_interval)

    async def get_node_ids(
        self, run_id: int, *, at_least: int = 0, wait_seconds: float = 0.0
    ) -> list[int]:
        return await look_until(
            self._clock,
            self._state.watch_nodes,
            self._state.get_node_ids,
            lambda node_ids: len(node_ids) >= at_least,
            wait_seconds,
        )

    async def push_messages(self, run_id: int, messages: Sequence[Message]) -> list[str]:
        for message in messages:
            if message.is_reply or not message.has_content():
                raise ValueError("a ServerApp pushes messages with content, not replies")
        return await self._state.push_messages(run_id, messages)

    async def pull_replies(
        self, run_id: int, message_ids: Sequence[str] | None, *, wait_seconds: float = 0.0
    ) -> list[Message]:
        wanted = None if message_ids is None else set(message_ids)
        return await look_until(
            self._clock,
            functools.partial(self._state.watch_replies, run_id),
            lambda: self._state.get_replies(run_id, message_ids),
            bool,
            wait_seconds,
            relevant=lambda message_id: wanted is None or message_id in wanted,
        )

    async def ack_replies(self, run_id: int, message_ids: Sequence[str]) -> None:
        await self._state.ack_replies(run_id, message_ids)

    async def save_context(self, run_id: int, state: RecordDict) -> None:
        await self._state.save_context(run_id, SERVER_NODE_ID, state)

    async def load_context(self, run_id: int) -> RecordDict:
        return await self._state.load_context(run_id, SERVER_NODE_ID)

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> None:
        await self._state.append_logs(run_id, lines, batch=batch)

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> None:
        await self._state.append_metrics(run_id, documents, batch=batch)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        await self._state.put_artifact(run_id, name, content)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        return await self._state.get_artifact(run_id, name)

    async def finish(self, run_id: int, status: RunStatus, reason: str = "") -> Run:
        if status not in (RunStatus.COMPLETED, RunStatus.FAILED):
            raise InvalidTransitionError(
                f"a ServerApp ends its run completed or failed, not {status}"
            )
        run = await self._state.get_run(run_id)
        if run.status.finished:
            return run
        log.info("run %d %s%s", run_id, status, f": {reason}" if reason else "")
        return await self._state.update_run_status(run_id, status, reason)
