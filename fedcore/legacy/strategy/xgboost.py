"""Legacy ``FedXgbBagging``, ``FedXgbCyclic`` and ``FedXgbNnAvg``.

A legacy XGBoost client sends its model as JSON bytes, the one tensor of its
``Parameters`` (``tensor_type`` ``""``). Bagging appends each result's trees to the
global model with :func:`fedcore.strategy.xgboost_trees.bag`, the rule of fedcore's
Message-API ``FedXgbBagging``; cyclic training keeps the latest result's model and
trains one client a round, in turn. ``FedXgbNnAvg`` (deprecated in Flower) averages
the neural network of each ``(Parameters, trees)`` result and keeps the trees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import aggregate
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.types import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from fedcore.strategy.xgboost_trees import bag

log = logging.getLogger("flwr")

XgbEvaluateFn = Callable[
    [int, Parameters, dict[str, Scalar]], tuple[float, dict[str, Scalar]] | None
]


class _XgbFedAvg(FedAvg):
    """What the tree strategies share: evaluation that aggregates metrics only (loss 0)."""

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        return 0, self.evaluate_metrics(server_round, results)


class FedXgbBagging(_XgbFedAvg):
    """Tree bagging: every result's trees appended to the global model."""

    def __init__(self, evaluate_function: XgbEvaluateFn | None = None, **kwargs: Any) -> None:
        self.evaluate_function = evaluate_function
        self.global_model: bytes | None = None
        super().__init__(**kwargs)

    def __repr__(self) -> str:
        return f"FedXgbBagging(accept_failures={self.accept_failures})"

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        model = self.global_model or b""
        for _, res in results:
            for tensor in res.parameters.tensors:
                model = bag(model, tensor)
        self.global_model = model
        return Parameters(tensors=[model], tensor_type=""), {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        if self.evaluate_function is None:
            return None
        result = self.evaluate_function(server_round, parameters, {})
        if result is None:
            return None
        loss, metrics = result
        return loss, metrics


class FedXgbCyclic(_XgbFedAvg):
    """Cyclic training: one client a round, in turn, each continuing the last one's model."""

    def __init__(self, **kwargs: Any) -> None:
        self.global_model: bytes | None = None
        super().__init__(**kwargs)

    def __repr__(self) -> str:
        return f"FedXgbCyclic(accept_failures={self.accept_failures})"

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        for _, res in results:
            for tensor in res.parameters.tensors:
                self.global_model = tensor
        if self.global_model is None:
            return None, {}
        return Parameters(tensors=[self.global_model], tensor_type=""), {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return _in_turn(
            server_round, super().configure_fit(server_round, parameters, client_manager)
        )

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        instructions = super().configure_evaluate(server_round, parameters, client_manager)
        return _in_turn(server_round, instructions)


def _in_turn(server_round: int, sampled: list[Any]) -> list[Any]:
    """The one sampled client whose turn round ``server_round`` is."""
    return [sampled[(server_round - 1) % len(sampled)]] if sampled else []


class FedXgbNnAvg(FedAvg):
    """FedAvg of the neural-network part of ``(Parameters, trees)`` results; the trees are kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log.warning("DEPRECATED FEATURE: the `FedXgbNnAvg` strategy")

    def __repr__(self) -> str:
        return f"FedXgbNnAvg(accept_failures={self.accept_failures})"

    def evaluate(
        self, server_round: int, parameters: Any
    ) -> tuple[float, dict[str, Scalar]] | None:
        if self.evaluate_fn is None:
            return None
        result = self.evaluate_fn(server_round, parameters, {})
        if result is None:
            return None
        loss, metrics = result
        return loss, metrics

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Any | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        pairs: list[tuple[Any, int]] = [(res.parameters, res.num_examples) for _, res in results]
        networks = [(parameters_to_ndarrays(p[0].parameters), n) for p, n in pairs]
        trees = [p[1] for p, _ in pairs]
        averaged = ndarrays_to_parameters(aggregate(networks))
        return [averaged, trees], self.fit_metrics(server_round, results)
