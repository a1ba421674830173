"""``NumPyClient``: the legacy client most Flower code is written as, in numpy arrays.

It answers with plain values (``fit`` returns ``(arrays, num_examples, metrics)``);
:meth:`NumPyClient.to_client` wraps it as a :class:`~fedcore.legacy.client.Client`
whose methods serialise those values as Flower's wrapper does. The wrapper overrides
only the methods the NumPyClient overrides, so ``maybe_call_*`` answers the others
``*_NOT_IMPLEMENTED``, as Flower's does.
"""

from __future__ import annotations

import functools
from abc import ABC
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from fedcore.domain.array import NDArrays
from fedcore.domain.context import Context
from fedcore.legacy.client import Client
from fedcore.legacy.types import (
    Code,
    Config,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

NDArrayInt: TypeAlias = npt.NDArray[np.int_]
NDArrayFloat: TypeAlias = npt.NDArray[np.float64]

_METHODS = ("get_properties", "get_parameters", "fit", "evaluate")


class NumPyClient(ABC):
    """A legacy client in numpy arrays: override the calls it answers.

    ``context`` is the :class:`Context` of the message being answered, set by the
    ClientApp before each call (Flower 1.8's ``NumPyClient.context``).
    """

    context: Context

    def get_properties(self, config: Config) -> dict[str, Scalar]:
        return {}

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return []

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Train on the local data from ``parameters``: the new arrays, how many
        examples, metrics."""
        return [], 0, {}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Evaluate ``parameters`` on the local data: the loss, how many examples,
        metrics."""
        return 0.0, 0, {}

    def get_context(self) -> Context:
        return self.context

    def set_context(self, context: Context) -> None:
        self.context = context

    def to_client(self) -> Client:
        """This client as a :class:`Client` (see the module docstring)."""
        return _wrapper_class(tuple(_overrides(self, method) for method in _METHODS))(self)


def _overrides(client: NumPyClient, method: str) -> bool:
    return getattr(type(client), method) is not getattr(NumPyClient, method)


def has_get_properties(client: NumPyClient) -> bool:
    return _overrides(client, "get_properties")


def has_get_parameters(client: NumPyClient) -> bool:
    return _overrides(client, "get_parameters")


def has_fit(client: NumPyClient) -> bool:
    return _overrides(client, "fit")


def has_evaluate(client: NumPyClient) -> bool:
    return _overrides(client, "evaluate")


_OK = "Success"
_FIT_RETURNS = (
    "NumPyClient.fit must return a tuple of 3: (NDArrays, int, dict[str, Scalar]), "
    "as in `return model.get_weights(), 10, {'accuracy': 0.95}`"
)
_EVALUATE_RETURNS = (
    "NumPyClient.evaluate must return a tuple of 3: (float, int, dict[str, Scalar]), "
    "as in `return 0.5, 10, {'accuracy': 0.95}`"
)


class _Wrapper(Client):
    """A NumPyClient as a Client; its subclasses (see :func:`_wrapper_class`) take the
    methods the NumPyClient overrides."""

    def __init__(self, numpy_client: NumPyClient) -> None:
        self.numpy_client = numpy_client

    @property
    def context(self) -> Context:
        return self.numpy_client.context

    @context.setter
    def context(self, context: Context) -> None:
        self.numpy_client.context = context


def _get_properties(self: _Wrapper, ins: GetPropertiesIns) -> GetPropertiesRes:
    properties = self.numpy_client.get_properties(config=ins.config)
    return GetPropertiesRes(status=Status(code=Code.OK, message=_OK), properties=properties)


def _get_parameters(self: _Wrapper, ins: GetParametersIns) -> GetParametersRes:
    arrays = self.numpy_client.get_parameters(config=ins.config)
    return GetParametersRes(
        status=Status(code=Code.OK, message=_OK), parameters=ndarrays_to_parameters(arrays)
    )


def _fit(self: _Wrapper, ins: FitIns) -> FitRes:
    results: Any = self.numpy_client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
    if not (
        len(results) == 3
        and isinstance(results[0], list)
        and isinstance(results[1], int)
        and isinstance(results[2], dict)
    ):
        raise TypeError(_FIT_RETURNS)
    arrays, num_examples, metrics = results
    return FitRes(
        status=Status(code=Code.OK, message=_OK),
        parameters=ndarrays_to_parameters(arrays),
        num_examples=num_examples,
        metrics=metrics,
    )


def _evaluate(self: _Wrapper, ins: EvaluateIns) -> EvaluateRes:
    results: Any = self.numpy_client.evaluate(parameters_to_ndarrays(ins.parameters), ins.config)
    if not (
        len(results) == 3
        and isinstance(results[0], float)
        and isinstance(results[1], int)
        and isinstance(results[2], dict)
    ):
        raise TypeError(_EVALUATE_RETURNS)
    loss, num_examples, metrics = results
    return EvaluateRes(
        status=Status(code=Code.OK, message=_OK),
        loss=loss,
        num_examples=num_examples,
        metrics=metrics,
    )


_IMPLEMENTATIONS = (_get_properties, _get_parameters, _fit, _evaluate)


@functools.cache
def _wrapper_class(overridden: tuple[bool, ...]) -> type[_Wrapper]:
    """The wrapper class for a NumPyClient that overrides the methods ``overridden``
    flags (in :data:`_METHODS` order); one class for each of the 16 combinations."""
    members = {
        method: implementation
        for method, implementation, given in zip(
            _METHODS, _IMPLEMENTATIONS, overridden, strict=True
        )
        if given
    }
    return type("NumPyClientWrapper", (_Wrapper,), members)
