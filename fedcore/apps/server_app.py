"""ServerApp: the code that drives a run — choose nodes, send messages, aggregate replies."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import anyio.to_thread

from fedcore.apps.grid import Grid, SyncGrid
from fedcore.domain import Context

Main: TypeAlias = Callable[[Any, Context], Any]
M = TypeVar("M", bound=Main)


class ServerApp:
    """Holds a run's ``main``; ``async def main(grid, context)`` or a plain ``def``.

    An ``async def main`` runs on the event loop and gets the :class:`Grid`; a plain
    ``def main`` runs in a worker thread and gets a :class:`SyncGrid`, whose
    methods have the same names and block instead of returning coroutines.
    Whatever ``main`` returns becomes the run's result value.
    """

    def __init__(self) -> None:
        self._main: Main | None = None

    def main(self) -> Callable[[M], M]:
        """Register the function that drives the run."""

        def decorator(function: M) -> M:
            if not callable(function):
                raise TypeError("main must be callable")
            if self._main is not None:
                raise ValueError("this ServerApp already has a main")
            self._main = function
            return function

        return decorator

    async def run(self, grid: Grid, context: Context) -> Any:
        """Call ``main`` with the grid and the server's context; return what it returns."""
        if self._main is None:
            raise TypeError("this ServerApp has no main: decorate one with @server.main()")
        main = self._main
        if inspect.iscoroutinefunction(main):
            result: Awaitable[Any] = main(grid, context)
            return await result
        return await anyio.to_thread.run_sync(main, SyncGrid(grid), context, abandon_on_cancel=True)
