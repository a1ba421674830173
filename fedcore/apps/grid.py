"""Grid: what a ServerApp talks to — the nodes of a run and the messages to them.

:class:`Grid` is the async interface; simulation and deployment each provide one
(an in-process grid over a LinkState, an HTTP client of the link's runtime API).
Replies are delivered by events: :meth:`Grid.receive` wakes when a reply is stored,
never on a timer. :class:`SyncGrid` is the same API for a plain ``def main``, which
runs in a worker thread and blocks on each call while the event loop does the work.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

import anyio.from_thread
import anyio.lowlevel

from fedcore.clock import Clock
from fedcore.domain import SERVER_NODE_ID, Message, RecordDict, Run

T = TypeVar("T")


class Grid(ABC):
    """The ServerApp's view of the federation, for one run."""

    @property
    @abstractmethod
    def run(self) -> Run:
        """The run this grid serves (its id, config and seed)."""

    @property
    @abstractmethod
    def clock(self) -> Clock:
        """The clock the run's timeouts and timings follow."""

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """A message of this run from the ServerApp to ``dst_node_id`` (Flower's signature).

        The same as ``Message(content, dst_node_id, message_type, group_id=group_id,
        ttl=ttl)`` with the run id and the sender already filled in; ``ttl=None`` is
        the default TTL. Nothing is sent until :meth:`push_messages`.
        """
        message = Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)
        message.metadata.run_id = self.run.run_id
        message.metadata.src_node_id = SERVER_NODE_ID
        return message

    @abstractmethod
    async def get_node_ids(self) -> list[int]:
        """The ids of the nodes online now."""

    @abstractmethod
    async def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        """Wait until at least ``count`` nodes are online and return their ids.

        Raises :class:`~fedcore.errors.NotEnoughNodesError` after ``timeout`` seconds.
        """

    @abstractmethod
    async def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Send messages to their nodes; return their ids (also written into each message)."""

    @abstractmethod
    async def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        """The replies available now to ``reply_to_message_ids``; each is handed out once.

        Without ids, every reply of this run that has arrived and was not handed out
        yet, oldest first (Flower 1.43's "pull any"; an empty list asks for none). It
        takes replies a :meth:`receive` may be waiting for, so use one or the other for
        a message. ``message_ids=`` is the deprecated name of ``reply_to_message_ids``
        (:func:`reply_filter`).
        """

    @abstractmethod
    def receive(
        self, message_ids: Iterable[str], *, timeout: float | None = None
    ) -> AsyncIterator[Message]:
        """Replies to ``message_ids`` in arrival order, until all arrived or ``timeout`` passed.

        Every message gets exactly one reply — content, or an error when its node
        failed or it expired — so the iteration ends by itself; ``timeout`` bounds
        how long it may take.
        """

    async def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Push ``messages`` and collect their replies (those in time, if ``timeout`` is set)."""
        ids = await self.push_messages(messages)
        return [reply async for reply in self.receive(ids, timeout=timeout)]


def pushable(messages: Iterable[Message]) -> list[Message]:
    """``messages`` as a list, if each may be pushed: a new Message with content.

    Every Grid checks this before sending, so the error is the same in simulation
    and deployment, and raised where the ServerApp made the mistake.
    """
    batch = list(messages)
    for message in batch:
        if not isinstance(message, Message):
            raise TypeError(f"push_messages takes Messages, got {type(message).__name__}")
        if message.is_reply or not message.has_content():
            raise ValueError("a ServerApp pushes messages with content, not replies")
        if message.metadata.message_id:
            raise ValueError(
                f"message {message.metadata.message_id} was pushed already; build a new Message"
            )
    return batch


def reply_filter(
    reply_to_message_ids: Iterable[str] | None, message_ids: Iterable[str] | None
) -> list[str] | None:
    """The ids a ``pull_messages`` call asks replies to, ``None`` for every reply.

    Flower 1.43 renamed the argument: ``message_ids=`` still works, with a
    ``DeprecationWarning`` pointing at the call (``TypeError`` beside the new name).
    Every Grid resolves its arguments here, so all of them say the same.
    """
    if message_ids is not None:
        if reply_to_message_ids is not None:
            raise TypeError("pull_messages takes reply_to_message_ids or message_ids, not both")
        warnings.warn(
            "pull_messages(message_ids=...) is deprecated: pass the ids as "
            "reply_to_message_ids (or first), as Flower 1.43 does",
            DeprecationWarning,
            stacklevel=3,
        )
        reply_to_message_ids = message_ids
    return None if reply_to_message_ids is None else list(reply_to_message_ids)


def _loop_token() -> anyio.lowlevel.EventLoopToken | None:
    """The running event loop's token, or None outside one (calls then need an anyio
    worker thread)."""
    try:
        return anyio.lowlevel.current_token()
    except RuntimeError:
        return None


class SyncGrid:
    """A blocking :class:`Grid` for a plain ``def main`` running in a worker thread.

    Each call runs the async method on the event loop and waits for it.
    ``strategy.start(grid=...)`` accepts a SyncGrid too. Made on the event loop's
    thread (as :meth:`ServerApp.run` makes it), it may be called from any other
    thread, not only from the worker thread ``main`` runs in: the legacy server calls
    its clients from a thread pool of its own.
    """

    def __init__(self, grid: Grid) -> None:
        self.async_grid = grid
        self._loop = _loop_token()

    @property
    def run(self) -> Run:
        return self.async_grid.run

    def _call(self, function: Callable[[], Awaitable[T]]) -> T:
        async def call() -> T:
            return await function()

        return anyio.from_thread.run(call, token=self._loop)

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.async_grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> list[int]:
        return self._call(self.async_grid.get_node_ids)

    def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
        return self._call(lambda: self.async_grid.wait_for_nodes(count, timeout=timeout))

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        batch = list(messages)
        return self._call(lambda: self.async_grid.push_messages(batch))

    def pull_messages(
        self,
        reply_to_message_ids: Iterable[str] | None = None,
        *,
        message_ids: Iterable[str] | None = None,
    ) -> list[Message]:
        ids = reply_filter(reply_to_message_ids, message_ids)
        return self._call(lambda: self.async_grid.pull_messages(ids))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        batch = list(messages)
        return self._call(lambda: self.async_grid.send_and_receive(batch, timeout=timeout))

    def receive(
        self, message_ids: Iterable[str], *, timeout: float | None = None
    ) -> Iterator[Message]:
        replies = self.async_grid.receive(list(message_ids), timeout=timeout)
        try:
            while True:
                try:
                    yield self._call(replies.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(replies, "aclose", None)
            if aclose is not None:
                self._call(aclose)
