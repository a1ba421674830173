"""ServerApp: the code that drives a run — choose nodes, send messages, aggregate replies."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeAlias, TypeVar

import anyio
import anyio.to_thread

from fedcore.apps.grid import Grid, SyncGrid
from fedcore.apps.lifespan import Lifespan, lifespan_context, takes_context
from fedcore.domain import Context

Main: TypeAlias = Callable[[Any, Context], Any]
M = TypeVar("M", bound=Main)
L = TypeVar("L", bound=Lifespan)


class ServerApp:
    """Holds a run's ``main``; ``async def main(grid, context)`` or a plain ``def``.

    An ``async def main`` runs on the event loop and gets the :class:`Grid`; a plain
    ``def main`` runs in a worker thread and gets a :class:`SyncGrid`, whose
    methods have the same names and block instead of returning coroutines.
    Whatever ``main`` returns becomes the run's result value. A lifespan
    (:meth:`lifespan`) runs around ``main``. The runtimes call :meth:`run`; calling
    the app, ``server(grid, context)``, is Flower's synchronous form (see
    :meth:`__call__`).
    """

    def __init__(self) -> None:
        self._main: Main | None = None
        self._lifespan_function: Lifespan | None = None
        self._lifespan_takes_context = False

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

    def lifespan(self) -> Callable[[L], L]:
        """Register a generator to run around ``main``: setup, ``yield``, teardown.

        It may take the server's :class:`Context` (Flower's ``def lifespan(context)``)
        or nothing. Its setup and teardown run in a worker thread, so loading a
        dataset there does not hold the event loop; teardown runs when ``main``
        returns or raises::

            @server.lifespan()
            def lifespan(context):
                EVAL["data"] = load_test_set(context.run_config["data-dir"])
                yield
                EVAL.clear()
        """

        def decorator(function: L) -> L:
            with_context = takes_context(function)
            if self._lifespan_function is not None:
                raise ValueError("this ServerApp already has a lifespan")
            self._lifespan_function = function
            self._lifespan_takes_context = with_context
            return function

        return decorator

    def __call__(self, grid: Any, context: Context) -> Any:
        """Run ``main(grid, context)`` here and now inside the lifespan, as Flower's
        ``app(grid, context)``, and return what it returns.

        ``grid`` is passed as it is: for a plain ``def main``, a blocking grid such as
        :class:`SyncGrid` (or a test's stand-in). An ``async def main`` runs on an
        event loop of its own, so it cannot be called so from a running loop's thread;
        there, await :meth:`run`.
        """
        main = self._checked_main()
        manager = self._lifespan_manager(context)
        with manager if manager is not None else contextlib.nullcontext():
            if not inspect.iscoroutinefunction(main):
                return main(grid, context)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(main(grid, context))
            raise TypeError(
                "server(grid, context) cannot run an async def main on the thread of a "
                "running event loop; await server.run(grid, context) there"
            )

    def _checked_main(self) -> Main:
        if self._main is None:
            raise TypeError("this ServerApp has no main: decorate one with @server.main()")
        return self._main

    async def run(self, grid: Grid, context: Context) -> Any:
        """Call ``main`` with the grid and the server's context; return what it returns."""
        main = self._checked_main()
        async with self._started(context):
            if inspect.iscoroutinefunction(main):
                result: Awaitable[Any] = main(grid, context)
                return await result
            return await anyio.to_thread.run_sync(
                main, SyncGrid(grid), context, abandon_on_cancel=True
            )

    def _started(self, context: Context) -> AbstractAsyncContextManager[None]:
        manager = self._lifespan_manager(context)
        return contextlib.nullcontext() if manager is None else _in_thread(manager)

    def _lifespan_manager(self, context: Context) -> AbstractContextManager[None] | None:
        """The lifespan, with or without ``context``, as a context manager to enter."""
        if self._lifespan_function is None:
            return None
        if self._lifespan_takes_context:
            return lifespan_context(self._lifespan_function, context)
        return lifespan_context(self._lifespan_function)


@contextlib.asynccontextmanager
async def _in_thread(manager: AbstractContextManager[None]) -> AsyncIterator[None]:
    """Enter and exit ``manager`` in a worker thread; the exit is shielded from cancellation."""
    await anyio.to_thread.run_sync(manager.__enter__)
    try:
        yield
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            suppressed = await anyio.to_thread.run_sync(
                manager.__exit__, type(exc), exc, exc.__traceback__
            )
        if not suppressed:
            raise
    else:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(manager.__exit__, None, None, None)
