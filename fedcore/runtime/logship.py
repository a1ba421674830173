"""Ship what a ServerApp process logs, prints and reports to its run on the link.

Records of the ``logging`` module and lines written to ``sys.stdout`` /
``sys.stderr`` (``print``) are queued as they come — from the event loop or from
the worker thread a plain ``def main`` runs in — and sent in batches by one task,
which wakes when a line is queued (:class:`LogShipper`). The output also still goes
where it went before (the process's own stdout, kept in a file by the exec), so
nothing depends on the link being reachable. The run's metrics lines travel the same
way, in a :class:`Shipper` of their own. Leaving a shipper sends what is still queued.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, Self, TextIO, TypeVar

import anyio
from anyio.abc import TaskGroup

T = TypeVar("T")

MAX_BATCH = 500
"""Lines per call to the link."""
MAX_QUEUED = 100_000
"""Lines held while the link is away; past that the oldest are dropped."""
MAX_LINE = 4096
"""Characters kept of one line; a longer one is cut, so one print cannot flood the log."""


class Shipper(Generic[T]):
    """Queue items and send them with ``send(items, batch)`` in order, from one task.

    Each batch is named (this shipper's random id and a counter), and a batch whose
    sending failed is sent again under the same name: the link appends a name it
    has just appended once only, so a response lost to a link restart does not
    double the items. With ``named``, each item is a batch of its own, named by
    ``named(item)``: then an item a relaunched ServerApp sends again under the name
    its dead predecessor last sent (a round's line, for the round done again) is
    appended once too. Leaving the shipper sends what is still queued;
    :meth:`drain` sends it now.
    """

    def __init__(
        self,
        send: Callable[[list[T], str], Awaitable[None]],
        *,
        named: Callable[[T], str] | None = None,
    ) -> None:
        self._send = send
        self._named = named
        self._sending = anyio.Lock()
        self._name = uuid.uuid4().hex
        self._batches = 0
        self._unsent: tuple[str, list[T]] | None = None  # a batch whose sending failed
        self._items: deque[T] = deque(maxlen=MAX_QUEUED)
        self._wake = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task_group: TaskGroup | None = None

    def put(self, item: T) -> None:
        """Queue an item (from any thread)."""
        self._items.append(item)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._ship)
        if self._items:  # queued before there was a loop to wake
            self._wake.set()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        await self._task_group.__aexit__(None, None, None)
        self._loop = None
        with anyio.CancelScope(shield=True):
            await self._flush()

    async def _ship(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._flush()

    async def drain(self) -> None:
        """Return once everything queued so far is sent (from the event loop)."""
        await self._flush()

    async def _flush(self) -> None:
        async with self._sending:
            while self._unsent is not None or self._items:
                if self._unsent is None:
                    self._unsent = self._next_batch()
                name, items = self._unsent
                await self._send(items, name)
                self._unsent = None

    def _next_batch(self) -> tuple[str, list[T]]:
        if self._named is not None:
            item = self._items.popleft()
            return self._named(item), [item]
        items = [self._items.popleft() for _ in range(min(MAX_BATCH, len(self._items)))]
        self._batches += 1
        return f"{self._name}-{self._batches}", items


class LogShipper(Shipper[str]):
    """A :class:`Shipper` of the process's log lines: records of the ``logging`` module and
    lines written to ``sys.stdout`` / ``sys.stderr``, while the shipper is entered."""

    def __init__(self, send: Callable[[list[str], str], Awaitable[None]]) -> None:
        super().__init__(send)
        self._handler = _Handler(self.put)
        self._streams: tuple[TextIO, TextIO] | None = None

    def put(self, item: str) -> None:
        """Queue a line (from any thread), cut at :data:`MAX_LINE` characters."""
        super().put(item[:MAX_LINE])

    async def __aenter__(self) -> Self:
        self._handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._handler)
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self.put)
        sys.stderr = _Tee(sys.stderr, self.put)
        return await super().__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        logging.getLogger().removeHandler(self._handler)
        assert self._streams is not None
        sys.stdout, sys.stderr = self._streams
        await super().__aexit__(exc_type, exc, tb)


class _Handler(logging.Handler):
    def __init__(self, put: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._put = put

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines():
                self._put(line)
        except Exception:  # a logging handler must never raise into the code that logged
            self.handleError(record)


class _Tee(io.TextIOBase):
    """A text stream that writes through to ``stream`` and queues each complete line."""

    def __init__(self, stream: TextIO, put: Callable[[str], None]) -> None:
        self._stream = stream
        self._put = put
        self._partial = ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._put(line)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
