"""Backend: what runs a node's ClientApp for one message.

The simulation engine (for each virtual node) and a deployed node (for each run) hand
a backend one message at a time with the node's :class:`~fedcore.domain.Context`, and
get back the reply and the context to keep.
Returning the context (rather than relying on in-place changes) lets a backend run
the ClientApp in another process and ship ``context.state`` back. A backend is an
async context manager: entering it starts its workers (and imports the ClientApp
where it runs), leaving it stops them, whatever happened in between.

A backend never raises for the ClientApp's failures; it answers with an error
reply (code 2 when the app raised, 8 when its worker crashed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from fedcore.domain import Context, Message


class Backend(ABC):
    """Runs ClientApps for the simulation engine or a node."""

    @property
    @abstractmethod
    def concurrency(self) -> int:
        """How many :meth:`run` calls this backend can usefully serve at once."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @abstractmethod
    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        """Handle ``message`` on the node that ``context`` describes; return reply and context."""
