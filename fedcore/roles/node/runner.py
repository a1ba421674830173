"""What runs a run's ClientApp for the node: an interface, built by whoever composes the node.

A node hosts one :class:`ClientAppRunner` per run, built by a :data:`RunnerFactory`
from the run, its unpacked app directory and the ``module:attr`` of its ClientApp.
In deployment the composition root (:mod:`fedcore.runtime`) passes a factory that
starts one ClientApp process (the simulation's process pool with one worker: code 8
when the process crashes, code 3 past the message's TTL); tests pass one that runs
the ClientApp in the test's own process. The node role depends on neither.

Entering a runner starts it — imports the ClientApp — and raises (preferably
:class:`~fedcore.errors.AppLoadError`, with a one-line message) when it cannot;
the node answers that run's messages with error code 1 then. Leaving it stops it.
:meth:`ClientAppRunner.run` answers the ClientApp's own failures with error replies
rather than raising; an exception from it means the runner itself broke.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Protocol

from fedcore.domain import Context, Message, Run


class ClientAppRunner(Protocol):
    """Runs one run's ClientApp, message by message; an async context manager."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
        """Handle ``message`` with ``context``; return the reply and the context to keep."""
        ...


RunnerFactory = Callable[[Run, Path, str], ClientAppRunner]
"""Builds a run's runner from the run, its app directory and its ClientApp's ``module:attr``."""
