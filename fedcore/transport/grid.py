"""The one Grid of both runtimes: a run's view of the federation, through the link.

:class:`LinkGrid` implements :class:`~fedcore.apps.grid.Grid` — pushing, pulling,
acknowledging, waiting for nodes and replies with their deadlines — over a small
:class:`GridChannel` per runtime. A simulation's channel calls the LinkState in this
process (:meth:`LinkGrid.in_process`) and waits on its announcements; a deployed
ServerApp's calls the link's runtime API (:meth:`LinkGrid.deployed`), whose long polls
the link answers as soon as a reply or a node arrives. Either way replies travel by
events end to end, and are acknowledged only once they are in this process.

The remote channel names messages before it pushes them, so a push repeated after a
lost response stores nothing twice, and retries every call with backoff while the
link is away (a restart) until ``link_patience`` seconds have passed; past that,
:class:`~fedcore.errors.LinkUnavailableError` ends the ServerApp. In process, the
state names the messages (from the run's seed) and nothing is ever lost in transit.

A message with a str or bytes value over ``max_value_len`` bytes is refused at the
push (:class:`~fedcore.errors.ValueTooLargeError`, naming the value and where the
cap is set), before any of the batch is sent: the link would refuse it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from typing import TypeVar

from fedcore.apps.grid import Grid, pushable, reply_filter
from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.clock import Clock
from fedcore.domain import Message, Run
from fedcore.domain.message import mark_delivered
from fedcore.errors import LinkUnavailableError, NotEnoughNodesError
from fedcore.state.base import LinkState
from fedcore.state.waiting import Announcements, look_until
from fedcore.transport.runtime import RuntimeService
from fedcore.wire import MAX_VALUE_LEN
from fedcore.wire.records import check_value_sizes

log = logging.getLogger(__name__)
T = TypeVar("T")

LONG_POLL = 20.0
"""Seconds one waiting call to a remote link may last; a longer wait is several calls."""
LINK_PATIENCE = 120.0
"""Seconds the grid keeps retrying while the link cannot be reached."""
LINK_BACKOFF = BackoffPolicy(initial=0.05, maximum=5.0)
"""How a call spaces its retries while the link is unavailable."""

# Where the cap on one value is set, for the error a push over it raises.
DEPLOYED_CAP = "the deployment's cap: fedcore serve --max-value-bytes, of the link and its nodes"
SIMULATED_CAP = "the simulation's cap: simulate(max_value_bytes=...), --max-value-bytes"


class ReplyFeed(ABC):
    """Where one wait for replies takes them from (:meth:`GridChannel.replies`)."""

    @abstractmethod
    async def take(self, pending: Collection[str] | None, wait_seconds: float) -> list[Message]:
        """The replies stored among ``pending`` (``None``: all the run's), not acknowledged;
        waits up to ``wait_seconds`` for a first one, and returns none if it runs out."""


class GridChannel(ABC):
    """What a :class:`LinkGrid` asks of the link for its run: the runtime's small part."""

    longest_wait: float
    """Seconds one waiting call may last (``math.inf``: no limit)."""

    @abstractmethod
    async def get_node_ids(self, *, at_least: int = 0, wait_seconds: float = 0.0) -> list[int]:
        """The nodes online; with ``at_least``, waits up to ``wait_seconds`` for that many."""

    @abstractmethod
    async def push_messages(self, messages: list[Message]) -> list[str]:
        """Store ``messages`` for their nodes; their ids."""

    @abstractmethod
    def replies(self) -> AbstractContextManager[ReplyFeed]:
        """A feed of replies for one wait: it hears every reply stored while it is open."""

    @abstractmethod
    async def ack_replies(self, message_ids: list[str]) -> None:
        """This process has the replies to ``message_ids``: the link may forget them."""

    async def call(self, function: Callable[[], Awaitable[T]]) -> T:
        """Call the link as this channel does (a remote one retries while the link is away)."""
        return await function()


class LinkGrid(Grid):
    """A Grid for run ``run`` over ``channel``: use :meth:`in_process` or :meth:`deployed`."""

    def __init__(
        self,
        channel: GridChannel,
        run: Run,
        clock: Clock,
        *,
        max_value_len: int = MAX_VALUE_LEN,
        cap: str = DEPLOYED_CAP,
    ) -> None:
        self._channel = channel
        self._run = run
        self._clock = clock
        self._max_value_len = max_value_len
        self._cap = cap

    @classmethod
    def in_process(
        cls, state: LinkState, run: Run, clock: Clock, *, max_value_len: int = MAX_VALUE_LEN
    ) -> LinkGrid:
        """The grid of a simulation, whose LinkState is in this process."""
        channel = StateChannel(state, run.run_id, clock)
        return cls(channel, run, clock, max_value_len=max_value_len, cap=SIMULATED_CAP)

    @classmethod
    def deployed(
        cls,
        service: RuntimeService,
        run: Run,
        clock: Clock,
        *,
        long_poll: float = LONG_POLL,
        link_patience: float = LINK_PATIENCE,
        max_value_len: int = MAX_VALUE_LEN,
    ) -> LinkGrid:
        """The grid of a deployed ServerApp, over the link's runtime API ``service``."""
        channel = RuntimeChannel(
            service, run.run_id, clock, long_poll=long_poll, link_patience=link_patience
        )
        return cls(channel, run, clock, max_value_len=max_value_len, cap=DEPLOYED_CAP)

    @property
    def run(self) -> Run:
        return self._run

    @property
    def clock(self) -> Clock:
        return self._clock

    async def call(self, function: Callable[[], Awaitable[T]]) -> T:
        """Call the link as the grid does: what else a ServerApp's runner asks of the link
        rides out a link restart just as the grid's own calls do."""
        return await self._channel.call(function)

    def _next_wait(self, deadline: float | None) -> float:
        """Seconds the next waiting call may last: not past ``deadline``, nor the channel's
        longest wait."""
        longest = self._channel.longest_wait
        if deadline is None:
            return longest
        return max(0.0, min(longest, deadline - self._clock.now()))

    async def get_node_ids(self) -> list[int]:
        return await self._channel.get_node_ids()

    async def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        deadline = None if timeout is None else self._clock.now() + timeout
        node_ids = await self._channel.get_node_ids()
        while len(node_ids) < count:
            if deadline is not None and self._clock.now() >= deadline:
                raise NotEnoughNodesError(
                    f"waited {timeout:g} s for {count} nodes; only {len(node_ids)} came online"
                )
            limit = (
                "" if deadline is None else f", giving up in {deadline - self._clock.now():.0f} s"
            )
            log.info("waiting for nodes: %d of %d online%s", len(node_ids), count, limit)
            node_ids = await self._channel.get_node_ids(
                at_least=count, wait_seconds=self._next_wait(deadline)
            )
        return node_ids

    async def push_messages(self, messages: Iterable[Message]) -> list[str]:
        batch = pushable(messages)
        for message in batch:
            check_value_sizes(message.content, self._max_value_len, whose=self._cap)
        ids = await self._channel.push_messages(batch)
        for message, message_id in zip(batch, ids, strict=True):
            message.metadata.run_id, message.metadata.message_id = self._run.run_id, message_id
        return ids

    async def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        with self._channel.replies() as feed:
            return await self._take(feed, reply_filter(reply_to_message_ids, message_ids), 0.0)

    async def _take(
        self, feed: ReplyFeed, pending: Collection[str] | None, wait: float
    ) -> list[Message]:
        """The replies to ``pending`` (``None``: all the run's), acknowledged once here."""
        replies = await feed.take(pending, wait)
        if replies:
            await self._channel.ack_replies(
                [reply.metadata.reply_to_message_id for reply in replies]
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
        with self._channel.replies() as feed:
            while pending:
                for reply in await self._take(feed, pending.keys(), self._next_wait(deadline)):
                    message_id = reply.metadata.reply_to_message_id
                    if message_id in pending:
                        del pending[message_id]
                        yield reply
                if pending and deadline is not None and self._clock.now() >= deadline:
                    log.info(
                        "receive timed out after %g s; %d replies missing", timeout, len(pending)
                    )
                    return


class StateChannel(GridChannel):
    """The channel of a simulation: the run's LinkState in this process, waited on through
    its announcements (:mod:`fedcore.state.waiting`)."""

    longest_wait = math.inf

    def __init__(self, state: LinkState, run_id: int, clock: Clock) -> None:
        self._state = state
        self._run_id = run_id
        self._clock = clock

    async def get_node_ids(self, *, at_least: int = 0, wait_seconds: float = 0.0) -> list[int]:
        return await look_until(
            self._clock,
            self._state.watch_nodes,
            self._state.get_node_ids,
            lambda node_ids: len(node_ids) >= at_least,
            wait_seconds,
        )

    async def push_messages(self, messages: list[Message]) -> list[str]:
        return await self._state.push_messages(self._run_id, messages)

    @contextlib.contextmanager
    def replies(self) -> Iterator[ReplyFeed]:
        with Announcements[str](partial(self._state.watch_replies, self._run_id)) as heard:
            yield _HeardReplies(self._state, self._run_id, self._clock, heard)

    async def ack_replies(self, message_ids: list[str]) -> None:
        await self._state.ack_replies(self._run_id, message_ids)


class _HeardReplies(ReplyFeed):
    """The replies of one wait in process: the first take looks at every pending id,
    each later one only at those whose replies the state announced since."""

    def __init__(
        self, state: LinkState, run_id: int, clock: Clock, heard: Announcements[str]
    ) -> None:
        self._state = state
        self._run_id = run_id
        self._clock = clock
        self._heard = heard
        self._looked = False

    async def take(self, pending: Collection[str] | None, wait_seconds: float) -> list[Message]:
        deadline = self._clock.now() + wait_seconds
        if pending is None or not self._looked:
            self._looked = True
            replies = await self._look(None if pending is None else list(pending))
            if replies or wait_seconds <= 0:
                return replies
        while heard := await self._heard.next(self._clock, max(0.0, deadline - self._clock.now())):
            if replies := await self._look(
                None if pending is None else [i for i in heard if i in pending]
            ):
                return replies
        return []

    async def _look(self, message_ids: list[str] | None) -> list[Message]:
        if message_ids == []:
            return []
        return await self._state.get_replies(self._run_id, message_ids)


class RuntimeChannel(GridChannel, ReplyFeed):
    """The channel of a deployed ServerApp: the link's runtime API ``service``, remote."""

    def __init__(
        self,
        service: RuntimeService,
        run_id: int,
        clock: Clock,
        *,
        long_poll: float = LONG_POLL,
        link_patience: float = LINK_PATIENCE,
    ) -> None:
        self._service = service
        self._run_id = run_id
        self._clock = clock
        self.longest_wait = long_poll
        self._link_patience = link_patience
        self._jitter = random.Random()

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

    async def get_node_ids(self, *, at_least: int = 0, wait_seconds: float = 0.0) -> list[int]:
        return await self.call(
            partial(
                self._service.get_node_ids,
                self._run_id,
                at_least=at_least,
                wait_seconds=wait_seconds,
            )
        )

    async def push_messages(self, messages: list[Message]) -> list[str]:
        # Named here, not by the link: pushing the same batch again after a lost
        # response (a link restart) then stores each message once (LinkState.push_messages).
        for message in messages:
            message.metadata.message_id = uuid.uuid4().hex
        return await self.call(partial(self._service.push_messages, self._run_id, messages))

    def replies(self) -> AbstractContextManager[ReplyFeed]:
        return contextlib.nullcontext(self)

    async def take(self, pending: Collection[str] | None, wait_seconds: float) -> list[Message]:
        ids = None if pending is None else list(pending)
        return await self.call(
            partial(self._service.pull_replies, self._run_id, ids, wait_seconds=wait_seconds)
        )

    async def ack_replies(self, message_ids: list[str]) -> None:
        await self.call(partial(self._service.ack_replies, self._run_id, message_ids))
