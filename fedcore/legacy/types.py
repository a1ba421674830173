"""The legacy API's value types: ``Parameters``, the ``*Ins``/``*Res`` pairs, ``Status``.

Flower's legacy client and server exchange these instead of RecordDicts; the
translation to and from a Message's content lives in :mod:`fedcore.legacy.conversion`.
``Parameters`` hold each array as ``numpy.save`` bytes (``tensor_type``
``"numpy.ndarray"``), the form legacy code reads and writes.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias

import numpy as np

from fedcore.domain.array import NDArray, NDArrays

Scalar: TypeAlias = bool | bytes | float | int | str
"""A config or metric value of the legacy API (no lists)."""
Metrics: TypeAlias = dict[str, Scalar]
Config: TypeAlias = dict[str, Scalar]
Properties: TypeAlias = dict[str, Scalar]
MetricsAggregationFn: TypeAlias = Callable[[list[tuple[int, Metrics]]], Metrics]

NUMPY_TENSOR_TYPE = "numpy.ndarray"
"""``Parameters.tensor_type`` of tensors in ``numpy.save`` format."""


class Code(Enum):
    """What a legacy client's answer says about the call."""

    OK = 0
    GET_PROPERTIES_NOT_IMPLEMENTED = 1
    GET_PARAMETERS_NOT_IMPLEMENTED = 2
    FIT_NOT_IMPLEMENTED = 3
    EVALUATE_NOT_IMPLEMENTED = 4


@dataclass
class Status:
    code: Code
    message: str


@dataclass
class Parameters:
    """A model as a list of serialised tensors, each ``tensor_type``-encoded bytes."""

    tensors: list[bytes]
    tensor_type: str


@dataclass
class GetParametersIns:
    config: Config


@dataclass
class GetParametersRes:
    status: Status
    parameters: Parameters


@dataclass
class FitIns:
    parameters: Parameters
    config: dict[str, Scalar]


@dataclass
class FitRes:
    status: Status
    parameters: Parameters
    num_examples: int
    metrics: dict[str, Scalar]


@dataclass
class EvaluateIns:
    parameters: Parameters
    config: dict[str, Scalar]


@dataclass
class EvaluateRes:
    status: Status
    loss: float
    num_examples: int
    metrics: dict[str, Scalar]


@dataclass
class GetPropertiesIns:
    config: Config


@dataclass
class GetPropertiesRes:
    status: Status
    properties: Properties


@dataclass
class ReconnectIns:
    seconds: int | None


@dataclass
class DisconnectRes:
    reason: str


def ndarray_to_bytes(ndarray: NDArray) -> bytes:
    """``ndarray`` in ``numpy.save`` format; never pickled, so object arrays are refused."""
    buffer = io.BytesIO()
    np.save(buffer, ndarray, allow_pickle=False)
    return buffer.getvalue()


def bytes_to_ndarray(tensor: bytes) -> NDArray:
    """The array ``numpy.save`` wrote to ``tensor``; pickled data is refused."""
    loaded: NDArray = np.load(io.BytesIO(tensor), allow_pickle=False)
    return loaded


def ndarrays_to_parameters(ndarrays: NDArrays) -> Parameters:
    return Parameters(
        tensors=[ndarray_to_bytes(ndarray) for ndarray in ndarrays],
        tensor_type=NUMPY_TENSOR_TYPE,
    )


def parameters_to_ndarrays(parameters: Parameters) -> NDArrays:
    return [bytes_to_ndarray(tensor) for tensor in parameters.tensors]
