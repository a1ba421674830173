"""``Client``: the legacy client, one method per call of the legacy server.

A legacy ClientApp (:mod:`fedcore.legacy.client_app`) makes a ``Client`` for each
message with its ``client_fn`` and calls the method the message asks for, through
``maybe_call_*``: a method the subclass does not override is not called, and the
answer says so with its ``*_NOT_IMPLEMENTED`` status, as Flower answers.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import TypeAlias

from fedcore.domain.context import Context
from fedcore.legacy.types import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    Status,
)


class Client(ABC):
    """A legacy client: override the calls it answers (Flower's abstract base class).

    ``context`` is the :class:`Context` of the message being answered, set by the
    ClientApp before each call (Flower 1.8's ``Client.context``).
    """

    context: Context

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        return GetPropertiesRes(status=_not_implemented("get_properties"), properties={})

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        return GetParametersRes(status=_not_implemented("get_parameters"), parameters=_nothing())

    def fit(self, ins: FitIns) -> FitRes:
        return FitRes(
            status=_not_implemented("fit"), parameters=_nothing(), num_examples=0, metrics={}
        )

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        return EvaluateRes(
            status=_not_implemented("evaluate"), loss=0.0, num_examples=0, metrics={}
        )

    def get_context(self) -> Context:
        return self.context

    def set_context(self, context: Context) -> None:
        self.context = context

    def to_client(self) -> Client:
        """This client itself (a ``NumPyClient`` converts; a ``Client`` already is one)."""
        return self


ClientFn: TypeAlias = Callable[[str], Client]
"""The older ``client_fn(cid: str) -> Client``."""
ClientFnExt: TypeAlias = Callable[[Context], Client]
"""``client_fn(context: Context) -> Client``."""

_NOT_IMPLEMENTED = {
    "get_properties": Code.GET_PROPERTIES_NOT_IMPLEMENTED,
    "get_parameters": Code.GET_PARAMETERS_NOT_IMPLEMENTED,
    "fit": Code.FIT_NOT_IMPLEMENTED,
    "evaluate": Code.EVALUATE_NOT_IMPLEMENTED,
}


def _not_implemented(method: str) -> Status:
    return Status(code=_NOT_IMPLEMENTED[method], message=f"Client does not implement `{method}`")


def _nothing() -> Parameters:
    return Parameters(tensor_type="", tensors=[])


def _overrides(client: Client, method: str) -> bool:
    return getattr(type(client), method) is not getattr(Client, method)


def has_get_properties(client: Client) -> bool:
    return _overrides(client, "get_properties")


def has_get_parameters(client: Client) -> bool:
    return _overrides(client, "get_parameters")


def has_fit(client: Client) -> bool:
    return _overrides(client, "fit")


def has_evaluate(client: Client) -> bool:
    return _overrides(client, "evaluate")


def maybe_call_get_properties(
    client: Client, get_properties_ins: GetPropertiesIns
) -> GetPropertiesRes:
    if not has_get_properties(client):
        return Client.get_properties(client, get_properties_ins)
    return client.get_properties(get_properties_ins)


def maybe_call_get_parameters(
    client: Client, get_parameters_ins: GetParametersIns
) -> GetParametersRes:
    if not has_get_parameters(client):
        return Client.get_parameters(client, get_parameters_ins)
    return client.get_parameters(get_parameters_ins)


def maybe_call_fit(client: Client, fit_ins: FitIns) -> FitRes:
    if not has_fit(client):
        return Client.fit(client, fit_ins)
    return client.fit(fit_ins)


def maybe_call_evaluate(client: Client, evaluate_ins: EvaluateIns) -> EvaluateRes:
    if not has_evaluate(client):
        return Client.evaluate(client, evaluate_ins)
    return client.evaluate(evaluate_ins)
