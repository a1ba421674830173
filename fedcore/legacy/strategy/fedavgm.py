"""Legacy ``FedAvgM`` (Hsu et al., 2019): FedAvg with server momentum.

With ``server_learning_rate != 1`` or ``server_momentum != 0`` the new model is the
step of fedcore's Message-API ``FedAvgM`` (:func:`~fedcore.legacy.strategy.fedopt.
server_step`) from ``initial_parameters``, which then become the new model, as in
Flower; that step needs ``initial_parameters``.
"""

from __future__ import annotations

import fedcore.strategy as message_api
from fedcore.domain.array import NDArrays
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.fedavg import ConfigFn, EvaluateFn, FedAvg
from fedcore.legacy.strategy.fedopt import as_list, server_step
from fedcore.legacy.types import (
    FitRes,
    MetricsAggregationFn,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)


class FedAvgM(FedAvg):
    """Federated averaging with server momentum."""

    def __init__(
        self,
        *,
        fraction_fit: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_fit_clients: int = 2,
        min_evaluate_clients: int = 2,
        min_available_clients: int = 2,
        evaluate_fn: EvaluateFn | None = None,
        on_fit_config_fn: ConfigFn | None = None,
        on_evaluate_config_fn: ConfigFn | None = None,
        accept_failures: bool = True,
        initial_parameters: Parameters | None = None,
        fit_metrics_aggregation_fn: MetricsAggregationFn | None = None,
        evaluate_metrics_aggregation_fn: MetricsAggregationFn | None = None,
        server_learning_rate: float = 1.0,
        server_momentum: float = 0.0,
    ) -> None:
        super().__init__(
            fraction_fit=fraction_fit,
            fraction_evaluate=fraction_evaluate,
            min_fit_clients=min_fit_clients,
            min_evaluate_clients=min_evaluate_clients,
            min_available_clients=min_available_clients,
            evaluate_fn=evaluate_fn,
            on_fit_config_fn=on_fit_config_fn,
            on_evaluate_config_fn=on_evaluate_config_fn,
            accept_failures=accept_failures,
            initial_parameters=initial_parameters,
            fit_metrics_aggregation_fn=fit_metrics_aggregation_fn,
            evaluate_metrics_aggregation_fn=evaluate_metrics_aggregation_fn,
        )
        self.optimizer = message_api.FedAvgM(
            server_learning_rate=server_learning_rate, server_momentum=server_momentum
        )
        self.server_learning_rate = server_learning_rate
        self.server_momentum = server_momentum
        self.server_opt = self.optimizer.server_opt

    def __repr__(self) -> str:
        return f"FedAvgM(accept_failures={self.accept_failures})"

    @property
    def momentum_vector(self) -> NDArrays | None:
        """The server's velocity, one array per layer (None before the first step)."""
        return as_list(self.optimizer.momentum_vector)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """``initial_parameters``, kept: the momentum step starts from them."""
        return self.initial_parameters

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        mean, metrics = super().aggregate_fit(server_round, results, failures)
        if mean is None or not self.server_opt:
            return mean, metrics
        if self.initial_parameters is None:
            raise ValueError("FedAvgM's server-side optimization needs initial_parameters")
        new = server_step(
            self.optimizer,
            server_round,
            parameters_to_ndarrays(self.initial_parameters),
            parameters_to_ndarrays(mean),
        )
        self.initial_parameters = ndarrays_to_parameters(new)
        return self.initial_parameters, metrics
