"""ClientApp: the code that runs on a node, one handler per message type.

A ClientApp routes message types (``train``, ``evaluate``, ``query``,
``train.<action>``) to ``def`` or ``async def`` handlers, wrapped by mods in Flower's
shape, with a lifespan for per-worker setup (docs/apps.md says what each offers).
:meth:`ClientApp.handle` is the one entry every backend calls, and it never raises for
the app's own failures: a missing handler, an exception or a wrong return value
becomes an error reply, so a broken ClientApp costs one failed reply, never a hung
round. Calling the app, ``client(msg, context)`` (Flower's form), runs the same chain
and lets everything through.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import TypeAlias, TypeVar, cast

import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from fedcore.apps.handler_threads import run_in_thread
from fedcore.apps.lifespan import Lifespan, lifespan_context, takes_context
from fedcore.domain import Context, Error, ErrorCode, Message
from fedcore.domain.message import MessageType, check_message_type

Handler: TypeAlias = Callable[[Message, Context], Message | Awaitable[Message]]
H = TypeVar("H", bound=Handler)
L = TypeVar("L", bound=Lifespan)
CallNext: TypeAlias = Callable[[Message, Context], Message]
"""What a mod calls to run the rest of the chain: ``call_next(msg, context) -> reply``."""
ClientAppCallable: TypeAlias = CallNext
"""Flower's name for :data:`CallNext` (``flwr.client.typing.ClientAppCallable``)."""
Mod: TypeAlias = Callable[[Message, Context, CallNext], Message]
"""A ClientApp mod: ``def mod(msg, context, call_next) -> Message`` (see the module docstring)."""
Finish: TypeAlias = Callable[[Awaitable[Message]], object]
"""How a chain of mods completes what an ``async def`` handler returned."""

DEFAULT_ACTION = "default"
"""The action that names a category's plain handler (``train.default`` is ``train``)."""

log = logging.getLogger(__name__)


class ClientApp:
    """Handlers for the messages a node receives.

    ::

        client = ClientApp()

        @client.train()
        def train(msg: Message, context: Context) -> Message: ...

        @client.evaluate()
        async def evaluate(msg: Message, context: Context) -> Message: ...

        @client.train("fast")             # answers message type "train.fast"
        def train_fast(msg, context): ...

        @client.query(mods=[message_size_mod])   # mods of this handler only
        def query(msg, context): ...

    ``mods`` wrap every handler, the first outermost, and a handler's own mods inside
    them (see the module docstring). An action is a Python identifier; ``"default"``
    names the handler without one (``@client.train("default")`` is ``@client.train()``,
    and a ``train.default`` message goes to it), as in Flower.
    """

    def __init__(self, *, mods: Sequence[Mod] | None = None) -> None:
        self._mods = _check_mods(mods)
        self._handlers: dict[str, Handler] = {}
        self._handler_mods: dict[str, list[Mod]] = {}
        self._lifespan_function: Lifespan | None = None
        self._lifespan_takes_context = False
        # What wraps each handler: a lifespan taking a Context (outermost), then the mods.
        self._around = self._mods
        self._warned = False

    def train(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        """Register the handler for ``train`` (or ``train.<action>``) messages, inside
        ``mods`` of its own if given."""
        return self._register(MessageType.TRAIN, action, mods)

    def evaluate(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        """Register the handler for ``evaluate`` (or ``evaluate.<action>``) messages, inside
        ``mods`` of its own if given."""
        return self._register(MessageType.EVALUATE, action, mods)

    def query(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        """Register the handler for ``query`` (or ``query.<action>``) messages, inside
        ``mods`` of its own if given."""
        return self._register(MessageType.QUERY, action, mods)

    def lifespan(self) -> Callable[[L], L]:
        """Register a generator to run around the messages this app serves.

        Without arguments it runs once per worker: code before ``yield`` runs before
        the worker's first message (load data, build a model, warm a cache), code
        after it when the worker stops::

            @client.lifespan()
            def lifespan():
                DATA["digits"] = load_digits()
                yield
                DATA.clear()

        With one argument (Flower's ``def lifespan(context)``) it runs around every
        message, outside the mods, and gets that message's :class:`Context`; an
        exception in it becomes the message's error reply.
        """

        def decorator(function: L) -> L:
            with_context = takes_context(function)
            if self._lifespan_function is not None:
                raise ValueError("this ClientApp already has a lifespan")
            self._lifespan_function = function
            self._lifespan_takes_context = with_context
            if with_context:
                per_message = cast(Callable[[Context], Iterator[None]], function)
                self._around = [_lifespan_mod(per_message), *self._mods]
            return function

        return decorator

    def started(self) -> AbstractContextManager[None]:
        """The once-per-worker lifespan as a context manager (nothing to do if there is
        none, or if the lifespan takes a Context and so runs around each message)."""
        if self._lifespan_function is None or self._lifespan_takes_context:
            return contextlib.nullcontext()
        return lifespan_context(cast(Callable[[], Iterator[None]], self._lifespan_function))

    @property
    def defining_modules(self) -> list[str]:
        """Names of the modules its handlers and lifespan were defined in."""
        functions = [*self._handlers.values(), self._lifespan_function]
        names = (getattr(function, "__module__", None) for function in functions)
        return list(dict.fromkeys(name for name in names if isinstance(name, str)))

    @property
    def one_message_at_a_time(self) -> bool:
        """Whether a backend that runs several nodes' handlers in one process must run
        this app's messages one after another. False: handlers keep nothing between
        calls but ``Context.state``. The legacy ``ClientApp(client_fn=...)`` says True
        (:mod:`fedcore.legacy.client_app`)."""
        return False

    @property
    def message_types(self) -> list[str]:
        """The message types this app answers, in registration order."""
        return list(self._handlers)

    @property
    def mods(self) -> list[Mod]:
        """The mods around every handler, outermost first."""
        return list(self._mods)

    def __call__(self, message: Message, context: Context) -> Message:
        """Run the app on ``message`` here and now, as Flower's ``app(message, context)``.

        The handler for its type runs inside the lifespan that takes a Context and the
        mods, as in :meth:`handle`; but what it returns comes back as it is, and what
        it (or a mod) raises is raised — ``ValueError`` if no handler answers the
        type. An ``async def`` handler is run to completion on an event loop of its
        own, so this cannot be called from a running loop's thread with one; there,
        await :meth:`handle`. A lifespan without arguments runs once per worker and
        is not entered here (enter :meth:`started` for it).
        """
        message_type = message.metadata.message_type
        handler = self._handlers.get(_routed(message_type))
        if handler is None:
            raise ValueError(self._no_handler(message_type))
        return self._chain(message_type, handler, _run_here, checked=False)(message, context)

    def _register(
        self, kind: str, action: str | None, mods: Sequence[Mod] | None
    ) -> Callable[[H], H]:
        if callable(action):
            raise TypeError(f"use @client.{kind}() with parentheses")
        own_mods = _check_mods(mods)
        message_type = _routed(check_message_type(kind if action is None else f"{kind}.{action}"))

        def decorator(handler: H) -> H:
            if not callable(handler):
                raise TypeError(f"a {message_type} handler must be callable")
            try:
                inspect.signature(handler).bind(None, None)
            except TypeError:
                raise TypeError(
                    f"a {message_type} handler takes (msg, context); "
                    f"{getattr(handler, '__name__', handler)!r} does not"
                ) from None
            except ValueError:
                pass  # a builtin without a signature: trust it
            if message_type in self._handlers:
                raise ValueError(f"a {message_type} handler is already registered")
            self._handlers[message_type] = handler
            if own_mods:
                self._handler_mods[message_type] = own_mods
            return handler

        return decorator

    async def handle(self, message: Message, context: Context, *, in_thread: bool) -> Message:
        """Run the handler for ``message`` and return its reply, or an error reply.

        ``in_thread`` runs a plain ``def`` handler in a worker thread, so that it
        does not stall an event loop shared with other work; cancelling the call
        abandons that thread (a hung handler cannot hold its caller), a daemon one
        that cannot hold the process at exit either (:mod:`.handler_threads`). ``async def``
        handlers always run on the calling loop.

        With mods, the chain runs where a plain handler would: in a worker thread
        with ``in_thread``, else on the calling thread. An ``async def`` handler puts
        the chain in a worker thread either way — plain mods can wait for it only
        from there — and still runs on the calling loop, reached through
        ``anyio.from_thread``.
        """
        message_type = message.metadata.message_type
        handler = self._handlers.get(_routed(message_type))
        if handler is None:
            return self._unhandled(message)
        try:
            if self._wrapping(message_type):
                if in_thread or _is_async(handler):
                    finish = partial(_finish_on, anyio.lowlevel.current_token())
                    chain = self._chain(message_type, handler, finish)
                    return await run_in_thread(chain, message, context)
                return self._chain(message_type, handler, _cannot_finish)(message, context)
            if in_thread and not _is_async(handler):
                reply = await run_in_thread(handler, message, context)
            else:
                reply = handler(message, context)
            if inspect.isawaitable(reply):  # async handlers, and plain ones returning a coroutine
                reply = await reply
        except (Exception, SystemExit) as exc:  # sys.exit() in a handler fails its reply only
            return self._failed(message, exc)
        return _check_reply(message, reply)

    def handle_blocking(
        self,
        message: Message,
        context: Context,
        run: Callable[[Awaitable[Message]], Message],
    ) -> Message:
        """:meth:`handle` for a process that owns its thread: a plain handler (or the
        chain of mods) runs here and now, and ``run`` (an event loop's
        ``run_until_complete``) finishes an async handler."""
        message_type = message.metadata.message_type
        handler = self._handlers.get(_routed(message_type))
        if handler is None:
            return self._unhandled(message)
        try:
            if self._wrapping(message_type):
                return self._chain(message_type, handler, run)(message, context)
            reply = handler(message, context)
            if inspect.isawaitable(reply):
                reply = run(reply)
        except (Exception, SystemExit) as exc:
            return self._failed(message, exc)
        return _check_reply(message, reply)

    def _wrapping(self, message_type: str) -> list[Mod]:
        """What wraps the handler of ``message_type``, outermost first: a lifespan taking
        a Context, the app's mods, the handler's own."""
        return [*self._around, *self._handler_mods.get(_routed(message_type), ())]

    def _chain(
        self, message_type: str, handler: Handler, finish: Finish, *, checked: bool = True
    ) -> CallNext:
        """The mods around ``handler`` as one ``call_next``. ``checked``: each link checks
        what its mod (or, innermost, the handler) returned, so every mod gets a proper
        reply; unchecked (``app(msg, context)``), what each returns passes as it is."""

        def innermost(msg: Message, context: Context) -> Message:
            reply = handler(msg, context)
            finished = finish(reply) if inspect.isawaitable(reply) else reply
            return _check_reply(msg, finished) if checked else cast(Message, finished)

        call_next: CallNext = innermost
        for mod in reversed(self._wrapping(message_type)):
            call_next = _link(mod, call_next, checked=checked)
        return call_next

    def _no_handler(self, message_type: str) -> str:
        known = ", ".join(self.message_types) or "none"
        return f"this ClientApp has no handler for {message_type!r} (it handles: {known})"

    def _unhandled(self, message: Message) -> Message:
        return _error_reply(message, self._no_handler(message.metadata.message_type))

    def _failed(self, message: Message, exc: BaseException) -> Message:
        self._log_failure(message, exc)
        text = str(exc)
        return _error_reply(
            message, f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        )

    def _log_failure(self, message: Message, exc: BaseException) -> None:
        meta = message.metadata
        if self._warned:
            log.debug(
                "%s handler%s raised on node %d",
                meta.message_type,
                " or a mod" if self._mods else "",
                meta.dst_node_id,
                exc_info=exc,
            )
            return
        self._warned = True
        log.warning(
            "%s handler%s raised on node %d (later failures are counted per round)",
            meta.message_type,
            " or a mod" if self._mods else "",
            meta.dst_node_id,
            exc_info=exc,
        )


def _is_async(function: object) -> bool:
    """Whether calling ``function`` returns a coroutine: an ``async def``, or an object
    whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        type(function).__call__
    )


def _lifespan_mod(function: Callable[[Context], Iterator[None]]) -> Mod:
    """A lifespan that takes a Context as the outermost mod, run around every message."""

    def lifespan(msg: Message, context: Context, call_next: CallNext) -> Message:
        with lifespan_context(function, context):
            return call_next(msg, context)

    return lifespan


def _check_mods(mods: object) -> list[Mod]:
    """``mods`` as a list, each checked to be a plain callable taking three arguments."""
    if mods is None:
        return []
    if not isinstance(mods, Sequence) or isinstance(mods, str | bytes):
        raise TypeError(f"mods must be a list of mods, got {type(mods).__name__}")
    for index, mod in enumerate(mods):
        if not callable(mod):
            raise TypeError(f"mods[{index}] must be callable, got {type(mod).__name__}")
        name = _name(mod)
        if _is_async(mod):
            raise TypeError(
                f"mods[{index}] ({name}) is async; a mod is a plain "
                "def mod(msg, context, call_next) -> Message"
            )
        try:
            inspect.signature(mod).bind(None, None, None)
        except TypeError:
            raise TypeError(f"mods[{index}] ({name}) must take (msg, context, call_next)") from None
        except ValueError:
            pass  # a builtin without a signature: trust it
    return list(mods)


def _routed(message_type: str) -> str:
    """The handler key of ``message_type``: Flower's default action is no action."""
    return message_type.removesuffix(f".{DEFAULT_ACTION}")


def _link(mod: Mod, call_next: CallNext, *, checked: bool) -> CallNext:
    """``mod`` with ``call_next`` bound, as the ``call_next`` of the mod outside it."""
    name = f"mod {_name(mod)}"

    def call(msg: Message, context: Context) -> Message:
        reply = mod(msg, context, call_next)
        return _check_reply(msg, reply, name) if checked else reply

    return call


def _finish_on(token: EventLoopToken, awaitable: Awaitable[Message]) -> object:
    """Finish an async handler, from a handler thread, on the event loop of ``token``."""

    async def wait() -> Message:
        return await awaitable

    return anyio.from_thread.run(wait, token=token)


def _run_here(awaitable: Awaitable[Message]) -> object:
    """Finish an async handler for ``app(msg, context)``, on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:

        async def wait() -> Message:
            return await awaitable

        return asyncio.run(wait())
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    raise TypeError(
        "app(msg, context) cannot finish an async def handler on the thread of a running "
        "event loop; await app.handle(msg, context, in_thread=False) there"
    )


def _cannot_finish(awaitable: Awaitable[Message]) -> object:
    """On the event loop's own thread a plain mod cannot wait for a coroutine."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    raise TypeError(
        "the handler returned an awaitable, which mods running on the event loop thread "
        "cannot wait for; declare the handler `async def` or run it with in_thread=True"
    )


def _name(function: object) -> str:
    return str(getattr(function, "__name__", None) or repr(function))


def _check_reply(message: Message, reply: object, source: str | None = None) -> Message:
    """``reply`` if it is a Message replying to ``message``, else an error reply
    blaming ``source`` (a mod), or by default the handler of ``message``'s type.
    The blame is put into words only on failure: this runs for every message."""
    if isinstance(reply, Message) and (
        reply.metadata.reply_to_message_id == message.metadata.message_id
    ):
        return reply
    source = source or f"the {message.metadata.message_type} handler"
    if not isinstance(reply, Message):
        return _error_reply(
            message,
            f"{source} returned {type(reply).__name__}; it must return "
            "Message(content, reply_to=msg)",
        )
    return _error_reply(message, f"{source} returned a Message that is not a reply to its message")


def _error_reply(message: Message, reason: str) -> Message:
    return Message(
        error=Error(int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION), reason), reply_to=message
    )
