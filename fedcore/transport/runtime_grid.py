"""The Grid of a deployed ServerApp: its run's view of the federation, through the link.

:class:`RuntimeGrid` implements :class:`~fedcore.apps.grid.Grid` over a
:class:`~fedcore.transport.runtime.RuntimeService` — in production the HTTP client
of the link's runtime API. Waiting is the link's: ``receive`` and
``wait_for_nodes`` make long-poll calls that the link answers as soon as a reply
or a node arrives, so replies travel by events end to end.

Replies are acknowledged only after they are in this process: a response lost on
the way is pulled again. Messages are named (their ids) here, so a push repeated
after a lost response stores nothing twice. While the link is away (a restart),
every call is retried with backoff until ``patience`` seconds have passed, so a
ServerApp rides out a link restart; past that,
:class:`~fedcore.errors.LinkUnavailableError` ends it.

A message with a str or bytes value over ``max_value_len`` bytes is refused at the
push (:class:`~fedcore.errors.ValueTooLargeError`, naming the value and the cap),
before any of the batch is sent: the link would refuse it.
"""

from __future__ import annotations

import functools
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

from fedcore.apps.grid import Grid, pushable, reply_filter
from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.clock import Clock
from fedcore.domain import Message, Run
from fedcore.domain.message import mark_delivered
from fedcore.errors import LinkUnavailableError, NotEnoughNodesError
from fedcore.transport.runtime import RuntimeService
from fedcore.wire import MAX_VALUE_LEN
from fedcore.wire.records import check_value_sizes

log = logging.getLogger(__name__)
T = TypeVar("T")

LONG_POLL = 20.0
"""Seconds one waiting call may last; a longer wait is several calls."""
LINK_PATIENCE = 120.0
"""Seconds the grid keeps retrying while the link cannot be reached."""
LINK_BACKOFF = BackoffPolicy(initial=0.05, maximum=5.0)
"""How a call spaces its retries while the link is unavailable."""


_CAP = "the deployment's cap: fedcore serve --max-value-bytes, of the link and its nodes"
"""Where the cap on one value is set, for the error a push over it raises."""


class RuntimeGrid(Grid):
    """A Grid for run ``run`` over ``service``."""

    def __init__(
        self,
        service: RuntimeService,
        run: Run,
        clock: Clock,
        *,
        long_poll: float = LONG_POLL,
        link_patience: float = LINK_PATIENCE,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> None:
        self._service = service
        self._run = run
        self._clock = clock
        self._long_poll = long_poll
        self._link_patience = link_patience
        self._max_value_len = max_value_len
        self._jitter = random.Random()

    @property
    def run(self) -> Run:
        return self._run

    @property
    def clock(self) -> Clock:
        return self._clock

    async def call(self, function: Callable[[], Awaitable[T]]) -> T:
        """Call the link, retrying with backoff while it is unavailable (up to the patience)."""
        give_up = self._clock.now() + self._link_patience
        backoff = Backoff(self._clock, LINK_BACKOFF, self._jitter)
        while True:
            try:
                return await function()
            except LinkUnavailableError as exc:
                delay = backoff.next_delay()
                if self._clock.now() + delay > give_up:
                    raise
                log.warning("the link is unavailable (%s); retrying", exc)
                await self._clock.sleep(delay)

    def _next_wait(self, deadline: float | None) -> float:
        """Seconds the next long poll may wait: ``long_poll`` at most, and not past ``deadline``."""
        if deadline is None:
            return self._long_poll
        return max(0.0, min(self._long_poll, deadline - self._clock.now()))

    async def get_node_ids(self) -> list[int]:
        run_id = self._run.run_id
        return await self.call(lambda: self._service.get_node_ids(run_id))

    async def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        run_id = self._run.run_id
        deadline = None if timeout is None else self._clock.now() + timeout
        while True:
            wait = self._next_wait(deadline)
            node_ids = await self.call(
                functools.partial(
                    self._service.get_node_ids, run_id, at_least=count, wait_seconds=wait
                )
            )
            if len(node_ids) >= count:
                return node_ids
            if deadline is not None and self._clock.now() >= deadline:
                raise NotEnoughNodesError(
                    f"waited {timeout:g} s for {count} nodes; only {len(node_ids)} came online"
                )
            log.info("waiting for nodes: %d of %d online", len(node_ids), count)

    async def push_messages(self, messages: Iterable[Message]) -> list[str]:
        batch = pushable(messages)
        for message in batch:
            check_value_sizes(message.content, self._max_value_len, whose=_CAP)
        # Named here, not by the link: pushing the same batch again after a lost
        # response (a link restart) then stores each message once (LinkState.push_messages).
        for message in batch:
            message.metadata.message_id = uuid.uuid4().hex
        run_id = self._run.run_id
        ids = await self.call(lambda: self._service.push_messages(run_id, batch))
        for message, message_id in zip(batch, ids, strict=True):
            message.metadata.run_id, message.metadata.message_id = run_id, message_id
        return ids

    async def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        return await self._take(reply_filter(reply_to_message_ids, message_ids), wait=0.0)

    async def _take(self, message_ids: list[str] | None, *, wait: float) -> list[Message]:
        """The replies to ``message_ids`` (``None``: all the run's), acknowledged once here."""
        run_id = self._run.run_id
        replies = await self.call(
            lambda: self._service.pull_replies(run_id, message_ids, wait_seconds=wait)
        )
        if replies:
            taken = [reply.metadata.reply_to_message_id for reply in replies]
            await self.call(lambda: self._service.ack_replies(run_id, taken))
        now = self._clock.now()
        for reply in replies:
            mark_delivered(reply, now)
        return replies

    async def receive(
        self, message_ids: Iterable[str], *, timeout: float | None = None
    ) -> AsyncIterator[Message]:
        pending = dict.fromkeys(message_ids)
        deadline = None if timeout is None else self._clock.now() + timeout
        while pending:
            wait = self._next_wait(deadline)
            for reply in await self._take(list(pending), wait=wait):
                message_id = reply.metadata.reply_to_message_id
                if message_id in pending:
                    del pending[message_id]
                    yield reply
            if pending and deadline is not None and self._clock.now() >= deadline:
                log.info("receive timed out after %g s; %d replies missing", timeout, len(pending))
                return
