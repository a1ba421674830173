"""The inline backend: ClientApps in this process — async handlers on the event loop,
plain ``def`` handlers in worker threads.

Deterministic and cheap to start, for tests, tiny models and debugging with
breakpoints; heavy numerical work belongs on the process backend. A ClientApp still
running when its message's TTL runs out is abandoned — cancelled if ``async``, left to
finish unread in its thread if plain — and answered with code 3, as the process
backend answers when it stops the worker. Handlers of several nodes run at once,
except those of an app whose :attr:`~fedcore.apps.client_app.ClientApp.one_message_at_a_time`
is true (a legacy ``ClientApp(client_fn=...)``, whose clients may share one module-level
model as in Flower, where each actor takes one message at a time): its messages take
turns, in arrival order, the wait counting against each message's TTL. An abandoned
handler gives up its turn when it is abandoned, its thread left to finish beside the
next one, so that a hung handler cannot hold the next message for ever.

ClientApps still running when the run ends are abandoned alike, unanswered; as it
closes, the backend waits a while for plain ones to return (:data:`STOP_GRACE`), so
that the process does not exit under them. Arrays reach the handler as read-only
views of the ServerApp's arrays (no copy), as they would arrive read-only from shared
memory or the network; configs and metrics are copied, so a handler cannot change what
other nodes receive.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from types import TracebackType
from typing import Self

import anyio.to_thread

from fedcore.apps.client_app import ClientApp
from fedcore.apps.handler_threads import wait_for_handlers
from fedcore.clock import Clock, SystemClock
from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    ErrorCode,
    Message,
    MetricRecord,
    Record,
    RecordDict,
)
from fedcore.domain.message import mark_delivered
from fedcore.workers.base import Backend

log = logging.getLogger(__name__)

INLINE_CONCURRENCY = 64
"""ClientApps the inline backend runs at once: plain ones share anyio's worker threads
(40 by default), async ones interleave on the event loop."""
STOP_GRACE = 5.0
"""Seconds the backend waits, as it closes, for plain handlers still running (a run that
ended with work in flight): a thread inside a C++ library at the interpreter's exit can
abort the process. The process pool gives its workers' lifespans as long."""


def read_only_view(content: RecordDict) -> RecordDict:
    """``content`` with every array a read-only view and every other record a copy."""
    view = RecordDict()
    for name, record in content.items():
        copied: Record
        if isinstance(record, ArrayRecord):
            copied = ArrayRecord()
            for key, array in record.items():
                readonly = array.view()
                readonly.flags.writeable = False
                copied[key] = readonly
        elif isinstance(record, MetricRecord):
            copied = MetricRecord(record)
        else:
            copied = ConfigRecord(record)
        view[name] = copied
    return view


class InlineBackend(Backend):
    """Runs a :class:`ClientApp` object on this process's event loop and threads.

    The ClientApp's lifespan runs once, around the whole simulation.
    """

    def __init__(
        self,
        client: ClientApp,
        *,
        concurrency: int = INLINE_CONCURRENCY,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._clock = clock or SystemClock()
        self._concurrency = concurrency
        self._lifespan: AbstractContextManager[None] | None = None
        self._turn: AbstractAsyncContextManager[object] = (
            anyio.Lock() if client.one_message_at_a_time else nullcontext()
        )

    @property
    def concurrency(self) -> int:
        return self._concurrency

    async def __aenter__(self) -> Self:
        lifespan = self._client.started()
        await anyio.to_thread.run_sync(lifespan.__enter__)
        self._lifespan = lifespan
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            running = await anyio.to_thread.run_sync(wait_for_handlers, STOP_GRACE)
            if running:
                log.warning(
                    "%d plain ClientApp handlers still ran %g s after the run ended; they are "
                    "left to the process's exit",
                    running,
                    STOP_GRACE,
                )
            if self._lifespan is not None:
                lifespan, self._lifespan = self._lifespan, None
                await anyio.to_thread.run_sync(lifespan.__exit__, exc_type, exc, tb)

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        delivered = message.with_content(read_only_view(message.content))
        mark_delivered(delivered, self._clock.now())
        meta = message.metadata
        with self._clock.move_on_after(meta.expires_at - self._clock.now()) as deadline:
            async with self._turn:
                return await self._client.handle(delivered, context, in_thread=True), context
        assert deadline.cancelled_caught
        reason = (
            f"the ClientApp was still running when the message's TTL of {meta.ttl:g} s ran "
            "out; it was abandoned"
        )
        return Message(
            error=Error(int(ErrorCode.MESSAGE_UNAVAILABLE), reason), reply_to=message
        ), context
