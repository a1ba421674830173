"""The in-process Grid: a ServerApp in the same process as its LinkState (simulation).

Waiting is event-driven: :meth:`InProcGrid.receive` subscribes to the state's reply
notifications *before* it looks at what has arrived, so no reply can slip between
the look and the wait, and then sleeps until a notification or its deadline. Replies
are acknowledged as soon as they are handed to the ServerApp, which lives in this
process and cannot lose them in transit.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from typing import Generic, TypeVar

import anyio

from fedcore.apps.grid import Grid, pushable, reply_filter
from fedcore.clock import Clock
from fedcore.domain import Message, Run
from fedcore.domain.message import mark_delivered
from fedcore.errors import NotEnoughNodesError
from fedcore.state.base import LinkState
from fedcore.wire import MAX_VALUE_LEN
from fedcore.wire.records import check_value_sizes

log = logging.getLogger(__name__)
T = TypeVar("T")


_CAP = "the simulation's cap: simulate(max_value_bytes=...), --max-value-bytes"
"""Where the cap on one value is set, for the error a push over it raises."""


class _Inbox(Generic[T]):
    """Items handed over by a synchronous callback, taken in batches by one waiter."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._ready = anyio.Event()

    def put(self, item: T) -> None:
        self._items.append(item)
        self._ready.set()

    async def take(self) -> list[T]:
        await self._ready.wait()
        items, self._items = self._items, []
        self._ready = anyio.Event()
        return items


class InProcGrid(Grid):
    """A :class:`~fedcore.apps.grid.Grid` that calls a LinkState directly.

    A message with a str or bytes value over ``max_value_len`` bytes is refused at the
    push (:class:`~fedcore.errors.ValueTooLargeError`), as a link refuses it, whether or
    not the backend would ever encode it."""

    def __init__(
        self, state: LinkState, run: Run, clock: Clock, *, max_value_len: int = MAX_VALUE_LEN
    ) -> None:
        self._state = state
        self._run = run
        self._clock = clock
        self._max_value_len = max_value_len

    @property
    def run(self) -> Run:
        return self._run

    @property
    def clock(self) -> Clock:
        return self._clock

    async def get_node_ids(self) -> list[int]:
        return await self._state.get_node_ids()

    async def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        inbox: _Inbox[int] = _Inbox()
        deadline = None if timeout is None else self._clock.now() + timeout
        with self._state.watch_nodes(inbox.put):
            while len(node_ids := await self._state.get_node_ids()) < count:
                remaining = None if deadline is None else deadline - self._clock.now()
                limit = "" if remaining is None else f", giving up in {remaining:.0f} s"
                log.info("waiting for nodes: %d of %d online%s", len(node_ids), count, limit)
                with self._clock.move_on_after(remaining) as scope:
                    await inbox.take()
                if scope.cancelled_caught:
                    raise NotEnoughNodesError(
                        f"waited {timeout:g} s for {count} nodes; only {len(node_ids)} came online"
                    )
        return node_ids

    async def push_messages(self, messages: Iterable[Message]) -> list[str]:
        batch = pushable(messages)
        for message in batch:
            check_value_sizes(message.content, self._max_value_len, whose=_CAP)
        return await self._state.push_messages(self._run.run_id, batch)

    async def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        return await self._take(reply_filter(reply_to_message_ids, message_ids))

    async def _take(self, message_ids: list[str] | None) -> list[Message]:
        """The replies to ``message_ids`` stored now (``None``: all), acknowledged."""
        replies = await self._state.get_replies(self._run.run_id, message_ids)
        await self._state.ack_replies(
            self._run.run_id, [reply.metadata.reply_to_message_id for reply in replies]
        )
        now = self._clock.now()
        for reply in replies:
            mark_delivered(reply, now)
        return replies

    async def receive(
        self, message_ids: Iterable[str], *, timeout: float | None = None
    ) -> AsyncIterator[Message]:
        pending = dict.fromkeys(message_ids)
        deadline = None if timeout is None else self._clock.now() + timeout
        inbox: _Inbox[str] = _Inbox()
        with self._state.watch_replies(self._run.run_id, inbox.put):
            ready = list(pending)
            while pending:
                for reply in await self._take([i for i in ready if i in pending]):
                    del pending[reply.metadata.reply_to_message_id]
                    yield reply
                if not pending:
                    return
                remaining = None if deadline is None else deadline - self._clock.now()
                with self._clock.move_on_after(remaining) as scope:
                    ready = await inbox.take()
                if scope.cancelled_caught:
                    log.info(
                        "receive timed out after %g s; %d replies missing", timeout, len(pending)
                    )
                    return
