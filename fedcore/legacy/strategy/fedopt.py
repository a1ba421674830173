"""Legacy ``FedOpt``, ``FedAdam``, ``FedYogi``, ``FedAdagrad`` (Reddi et al., 2021).

Each takes the round's example-weighted mean (legacy :class:`FedAvg`) as the target of
a server optimizer step from ``current_weights``. The step is the one of fedcore's
Message-API twin — the legacy strategy holds one (:attr:`FedOpt.optimizer`) and asks
its ``server_update`` — so the moments ``m_t``/``v_t`` live there. As fedcore's, the
step applies to floating-point arrays only; Flower's legacy classes step every array
(docs/from-flower.md). Legacy ``FedOpt`` itself only averages, as Flower's does.
"""

from __future__ import annotations

from typing import Any

import fedcore.strategy as message_api
from fedcore.domain import ArrayRecord
from fedcore.domain.array import NDArrays
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import ndarrays
from fedcore.legacy.strategy.fedavg import ConfigFn, EvaluateFn, FedAvg
from fedcore.legacy.types import (
    FitRes,
    MetricsAggregationFn,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)


def server_step(
    optimizer: message_api.FedAvg, server_round: int, current: NDArrays, mean: NDArrays
) -> NDArrays:
    """The new global model: ``optimizer``'s server update from ``current`` given the
    round's ``mean`` (arrays keyed ``"0"``, ``"1"``, … by their position)."""
    optimizer.current_arrays = ArrayRecord(list(current))
    return ndarrays(optimizer.server_update(server_round, ArrayRecord(list(mean))))


def as_list(state: dict[str, Any]) -> NDArrays | None:
    """An optimizer's per-array state in model order, as Flower's legacy lists; None if empty."""
    return [state[key] for key in sorted(state, key=int)] if state else None


class FedOpt(FedAvg):
    """The adaptive family's base: FedAvg that keeps the current global model."""

    optimizer: message_api.FedOpt | None = None
    """The Message-API strategy whose server step this one takes (none for FedOpt)."""

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
        initial_parameters: Parameters,
        fit_metrics_aggregation_fn: MetricsAggregationFn | None = None,
        evaluate_metrics_aggregation_fn: MetricsAggregationFn | None = None,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
        beta_1: float = 0.0,
        beta_2: float = 0.0,
        tau: float = 1e-9,
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
        self.current_weights = parameters_to_ndarrays(initial_parameters)
        self.eta = eta
        self.eta_l = eta_l
        self.tau = tau
        self.beta_1 = beta_1
        self.beta_2 = beta_2

    def __repr__(self) -> str:
        return f"FedOpt(accept_failures={self.accept_failures})"

    @property
    def m_t(self) -> NDArrays | None:
        """The first moment, one array per layer (None before the first step)."""
        return None if self.optimizer is None else as_list(self.optimizer.m_t)

    @property
    def v_t(self) -> NDArrays | None:
        """The second moment, one array per layer (None before the first step)."""
        return None if self.optimizer is None else as_list(self.optimizer.v_t)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        mean, metrics = super().aggregate_fit(server_round, results, failures)
        if self.optimizer is None or mean is None:
            return mean, metrics
        self.current_weights = server_step(
            self.optimizer, server_round, self.current_weights, parameters_to_ndarrays(mean)
        )
        return ndarrays_to_parameters(self.current_weights), metrics


class FedAdam(FedOpt):
    """FedOpt with Adam's step (bias-corrected, ``t = server_round + 1`` as Flower's)."""

    def __init__(
        self,
        *,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-9,
        **kwargs: Any,
    ) -> None:
        super().__init__(eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau, **kwargs)
        self.optimizer = message_api.FedAdam(
            eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau
        )

    def __repr__(self) -> str:
        return f"FedAdam(accept_failures={self.accept_failures})"


class FedYogi(FedOpt):
    """FedOpt with Yogi's step."""

    def __init__(
        self,
        *,
        eta: float = 1e-2,
        eta_l: float = 0.0316,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        super().__init__(eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau, **kwargs)
        self.optimizer = message_api.FedYogi(
            eta=eta, eta_l=eta_l, beta_1=beta_1, beta_2=beta_2, tau=tau
        )

    def __repr__(self) -> str:
        return f"FedYogi(accept_failures={self.accept_failures})"


class FedAdagrad(FedOpt):
    """FedOpt with Adagrad's step."""

    def __init__(
        self, *, eta: float = 1e-1, eta_l: float = 1e-1, tau: float = 1e-9, **kwargs: Any
    ) -> None:
        super().__init__(eta=eta, eta_l=eta_l, beta_1=0.0, beta_2=0.0, tau=tau, **kwargs)
        self.optimizer = message_api.FedAdagrad(eta=eta, eta_l=eta_l, tau=tau)

    def __repr__(self) -> str:
        return f"FedAdagrad(accept_failures={self.accept_failures})"
