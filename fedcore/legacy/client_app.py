"""The ClientApp of ``flwr.client`` / ``flwr.clientapp``: fedcore's, plus Flower's ``client_fn``.

``ClientApp(client_fn=client_fn, mods=[...])`` is how legacy apps are written: for
each ``train``, ``evaluate``, ``get_properties`` or ``get_parameters`` message it
calls ``client_fn(context)`` (or the older ``client_fn(cid: str)``, adapted as
Flower adapts it), converts a returned ``NumPyClient`` with ``to_client()``, and
answers with the client's ``fit``/``evaluate``/… through ``maybe_call_*``, as
Flower's message handler does. Mods wrap those answers as they wrap any handler.

Both vintages meet in both directions (docs/from-flower.md, "The legacy API"): a
legacy client answers a Message-API message (``arrays`` and ``config``) in the
Message API's shape, and a handler registered with ``@app.train()`` or
``@app.evaluate()`` answers the legacy server's ``fitins.*``/``evaluateins.*``
message, seeing it — and replying — in the Message API's shape. The contents are
translated by :mod:`fedcore.legacy.conversion`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from fedcore.apps.client_app import ClientApp as MessageClientApp
from fedcore.apps.client_app import H, Handler, Mod
from fedcore.domain import Context, Message, MessageType, RecordDict
from fedcore.legacy import conversion
from fedcore.legacy.client import (
    Client,
    ClientFn,
    ClientFnExt,
    maybe_call_evaluate,
    maybe_call_fit,
    maybe_call_get_parameters,
    maybe_call_get_properties,
)
from fedcore.legacy.conversion import MessageTypeLegacy
from fedcore.legacy.numpy_client import NumPyClient
from fedcore.legacy.types import EvaluateIns, FitIns

_log = logging.getLogger("flwr")

_LEGACY_INS = {MessageType.TRAIN: "fitins", MessageType.EVALUATE: "evaluateins"}
"""The legacy instructions a Message-API handler of each category may be sent."""


class ClientApp(MessageClientApp):
    """fedcore's :class:`~fedcore.apps.client_app.ClientApp`, taking Flower's ``client_fn``.

    ::

        def client_fn(context: Context) -> Client:
            return FlowerClient().to_client()

        app = ClientApp(client_fn=client_fn)

    An app has either a ``client_fn`` or handlers registered with its decorators, not
    both (``ValueError``, as in Flower).
    """

    def __init__(
        self, client_fn: ClientFnExt | ClientFn | None = None, mods: Sequence[Mod] | None = None
    ) -> None:
        super().__init__(mods=mods)
        self._client_fn: ClientFnExt | None = None
        self._client_fn_module: str | None = None
        self._warned_numpy_client = False
        if client_fn is None:
            return
        self._client_fn = _adapt_client_fn(client_fn)
        self._client_fn_module = getattr(client_fn, "__module__", None)
        answers: dict[str, Handler] = {
            MessageType.TRAIN: self._fit,
            MessageType.EVALUATE: self._evaluate,
            MessageTypeLegacy.GET_PROPERTIES: self._get_properties,
            MessageTypeLegacy.GET_PARAMETERS: self._get_parameters,
        }
        self._handlers.update(answers)

    def train(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        self._refuse_decorators(MessageType.TRAIN)
        return _translating(super().train(action, mods=mods), MessageType.TRAIN, action)

    def evaluate(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        self._refuse_decorators(MessageType.EVALUATE)
        return _translating(super().evaluate(action, mods=mods), MessageType.EVALUATE, action)

    def query(
        self, action: str | None = None, *, mods: Sequence[Mod] | None = None
    ) -> Callable[[H], H]:
        self._refuse_decorators(MessageType.QUERY)
        return super().query(action, mods=mods)

    @property
    def defining_modules(self) -> list[str]:
        """As fedcore's, with the module of the ``client_fn`` first."""
        own = [self._client_fn_module] if self._client_fn_module else []
        return list(dict.fromkeys([*own, *super().defining_modules]))

    @property
    def one_message_at_a_time(self) -> bool:
        """True for an app made with a ``client_fn``: Flower runs a process's ClientApp
        on one message at a time (each simulation actor takes one), so legacy code —
        and many of Flower's tutorials — trains one module-level model from every
        client. An app of ``@app.train()``-style handlers runs as fedcore's does."""
        return self._client_fn is not None

    def _refuse_decorators(self, category: str) -> None:
        if self._client_fn is not None:
            raise ValueError(
                f"Use either `@app.{category}()` or `client_fn`, but not both: this "
                "ClientApp was made with a client_fn, which answers every message"
            )

    # ---- a client_fn's client answering

    def _client(self, context: Context) -> Client:
        assert self._client_fn is not None
        client: Client | NumPyClient = self._client_fn(context)
        if isinstance(client, NumPyClient):
            if not self._warned_numpy_client:
                self._warned_numpy_client = True
                _log.warning(
                    "Deprecation Warning: The `client_fn` function must return an instance "
                    "of `Client`, but an instance of `NumpyClient` was returned. Please use "
                    "`NumPyClient.to_client()` method to convert it to `Client`."
                )
            client = client.to_client()
        client.set_context(context)
        return client

    def _fit(self, message: Message, context: Context) -> Message:
        client, content = self._client(context), message.content
        if conversion.is_legacy_content(content, "fitins"):
            fitins = conversion.recorddict_to_fitins(content, keep_input=True)
            fitres = maybe_call_fit(client, fitins)
            return Message(
                conversion.fitres_to_recorddict(fitres, keep_input=False), reply_to=message
            )
        parameters, config, names = conversion.message_api_ins(content)
        fitres = maybe_call_fit(client, FitIns(parameters=parameters, config=config))
        return Message(conversion.fitres_to_message_api(fitres, names), reply_to=message)

    def _evaluate(self, message: Message, context: Context) -> Message:
        client, content = self._client(context), message.content
        if conversion.is_legacy_content(content, "evaluateins"):
            evaluateins = conversion.recorddict_to_evaluateins(content, keep_input=True)
            evaluateres = maybe_call_evaluate(client, evaluateins)
            return Message(conversion.evaluateres_to_recorddict(evaluateres), reply_to=message)
        parameters, config, _ = conversion.message_api_ins(content)
        evaluateres = maybe_call_evaluate(client, EvaluateIns(parameters=parameters, config=config))
        return Message(conversion.evaluateres_to_message_api(evaluateres), reply_to=message)

    def _get_properties(self, message: Message, context: Context) -> Message:
        ins = conversion.recorddict_to_getpropertiesins(message.content)
        res = maybe_call_get_properties(self._client(context), ins)
        return Message(conversion.getpropertiesres_to_recorddict(res), reply_to=message)

    def _get_parameters(self, message: Message, context: Context) -> Message:
        ins = conversion.recorddict_to_getparametersins(message.content)
        res = maybe_call_get_parameters(self._client(context), ins)
        return Message(
            conversion.getparametersres_to_recorddict(res, keep_input=False), reply_to=message
        )


def _adapt_client_fn(client_fn: ClientFnExt | ClientFn) -> ClientFnExt:
    """``client_fn`` as ``client_fn(context)``: the older ``client_fn(cid: str)`` (a
    parameter annotated ``str`` or named ``cid``) gets the node's ``partition-id``, or
    its node id, as a string, with Flower's deprecation warning."""
    parameters = inspect.signature(client_fn).parameters
    if len(parameters) != 1:
        raise ValueError(
            "A `ClientApp` cannot make use of a `client_fn` that does not have a signature "
            "in the form: `def client_fn(context: Context)`. You can import the `Context` "
            "like this: `from flwr.app import Context`"
        )
    name, parameter = next(iter(parameters.items()))
    if parameter.annotation not in (str, "str") and name != "cid":
        return cast(ClientFnExt, client_fn)
    _log.warning(
        "DEPRECATED FEATURE: `client_fn` now expects a signature `def client_fn(context: "
        "Context)`. The provided `client_fn` has signature: %s. You can import the "
        "`Context` like this: `from flwr.app import Context`",
        dict(parameters.items()),
    )
    by_cid = cast(ClientFn, client_fn)

    def adapted(context: Context) -> Client:
        return by_cid(str(context.node_config.get("partition-id", context.node_id)))

    return adapted


# ---- a Message-API handler answering the legacy server


def _translating(register: Callable[[H], H], category: str, action: str | None) -> Callable[[H], H]:
    """``register``, registering a handler of ``category``'s default action so that
    legacy instructions reach it, and its reply leaves, in the Message API's shape."""
    if action not in (None, "default"):
        return register

    def decorator(handler: H) -> H:
        register(cast(H, _translated(handler, _LEGACY_INS[category])))
        return handler

    return decorator


def _translated(handler: Handler, ins: str) -> Handler:
    """``handler``, seeing a legacy ``ins`` message as Message-API content."""

    def legacy(message: Message) -> bool:
        return (
            isinstance(message, Message)
            and message.has_content()
            and conversion.is_legacy_content(message.content, ins)
        )

    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
        asynchronous = cast(Callable[[Message, Context], Awaitable[Message]], handler)

        @functools.wraps(handler)
        async def translate_async(message: Message, context: Context) -> Any:
            if not legacy(message):
                return await asynchronous(message, context)
            reply = await asynchronous(_as_message_api(message, ins), context)
            return _as_legacy(reply, ins)

        return translate_async

    @functools.wraps(handler)
    def translate(message: Message, context: Context) -> Any:
        if not legacy(message):
            return handler(message, context)
        return _as_legacy(handler(_as_message_api(message, ins), context), ins)

    return translate


def _as_message_api(message: Message, ins: str) -> Message:
    return message.with_content(conversion.legacy_ins_to_message_api(message.content, ins))


def _as_legacy(reply: object, ins: str) -> object:
    """The handler's reply with legacy content; anything else (an error reply, a wrong
    return value) as it is, for the ClientApp to judge."""
    if not isinstance(reply, Message) or not reply.has_content():
        return reply
    content: RecordDict = reply.content
    if ins == "fitins":
        return reply.with_content(conversion.message_api_to_fitres(content))
    return reply.with_content(conversion.message_api_to_evaluateres(content))
