"""Legacy ``FedAvgAndroid``: FedAvg for Flower's Android clients, whose tensors are raw
float32 bytes (``tensor_type`` ``"numpy.nda"``), not ``numpy.save`` files.

The mean is FedAvg's (:func:`~fedcore.legacy.strategy.aggregate.aggregate`); only the
encoding differs, and as Flower's, no metrics are aggregated.
"""

from __future__ import annotations

import numpy as np

from fedcore.domain.array import NDArray, NDArrays
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import aggregate, weighted_loss_avg
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.types import EvaluateRes, FitRes, Parameters, Scalar

ANDROID_TENSOR_TYPE = "numpy.nda"


class FedAvgAndroid(FedAvg):
    """FedAvg over float32 byte buffers."""

    def __repr__(self) -> str:
        return f"FedAvg(accept_failures={self.accept_failures})"

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        if self.evaluate_fn is None:
            return None
        result = self.evaluate_fn(server_round, self.parameters_to_ndarrays(parameters), {})
        if result is None:
            return None
        loss, metrics = result
        return loss, metrics

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        models = [
            (self.parameters_to_ndarrays(res.parameters), res.num_examples) for _, res in results
        ]
        return self.ndarrays_to_parameters(aggregate(models)), {}

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        return weighted_loss_avg([(res.num_examples, res.loss) for _, res in results]), {}

    def ndarrays_to_parameters(self, ndarrays: NDArrays) -> Parameters:
        return Parameters([self.ndarray_to_bytes(a) for a in ndarrays], ANDROID_TENSOR_TYPE)

    def parameters_to_ndarrays(self, parameters: Parameters) -> NDArrays:
        return [self.bytes_to_ndarray(tensor) for tensor in parameters.tensors]

    def ndarray_to_bytes(self, ndarray: NDArray) -> bytes:
        return ndarray.tobytes()

    def bytes_to_ndarray(self, tensor: bytes) -> NDArray:
        return np.frombuffer(tensor, dtype=np.float32)
