"""Lifespans: the generator an app runs around its work, with or without a Context.

fedcore's lifespans take no argument; Flower's take the app's ``Context``
(``def lifespan(context)``). Both are accepted by :meth:`ClientApp.lifespan
<fedcore.apps.client_app.ClientApp.lifespan>` and :meth:`ServerApp.lifespan
<fedcore.apps.server_app.ServerApp.lifespan>`, which look at the signature once,
when the lifespan is registered, rather than on every call. Both run as Flower runs
a lifespan (:func:`lifespan_context`): the code after ``yield`` runs when the work
ends, whether or not it raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import TypeAlias

from fedcore.domain import Context

Lifespan: TypeAlias = Callable[[], Iterator[None]] | Callable[[Context], Iterator[None]]


def takes_context(function: object) -> bool:
    """Whether a lifespan generator ``function`` takes a Context (Flower's form) or
    nothing (fedcore's); raise ``TypeError`` if it is no generator or takes more."""
    if not inspect.isgeneratorfunction(function):
        raise TypeError("a lifespan is a generator function: setup, then `yield`")
    signature = inspect.signature(function)
    try:
        signature.bind()
    except TypeError:
        pass
    else:
        return False
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(
            "a lifespan takes no argument or one (the Context); "
            f"{getattr(function, '__name__', function)!r} takes more"
        ) from None
    return True


@contextmanager
def lifespan_context(function: Callable[..., Iterator[None]], *args: object) -> Iterator[None]:
    """Run the lifespan generator ``function(*args)`` around a block, as Flower does.

    The code before its ``yield`` runs on entry; the code after it on exit, whether or
    not the block raised: the block's exception is not thrown into the generator, so a
    bare ``yield`` is enough to have the teardown run, and the exception goes on after
    it. A lifespan that does not yield, or yields more than once, is a ``RuntimeError``.
    """
    steps = function(*args)
    try:
        next(steps)
    except StopIteration:
        raise RuntimeError("a lifespan must yield once; it returned without yielding") from None
    try:
        yield
    finally:
        try:
            next(steps)
        except StopIteration:
            pass
        else:
            if isinstance(steps, Generator):
                steps.close()
            raise RuntimeError("a lifespan must yield only once")
