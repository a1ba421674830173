"""Legacy ``FedAvg``: Flower's constructor arguments and callbacks, fedcore's mean.

Sampling, instructions and callbacks behave as in Flower 1.42's legacy ``FedAvg``:
``max(int(n × fraction_fit), min_fit_clients)`` of the ``n`` available clients
train, each with ``on_fit_config_fn(server_round)`` as its config; the mean of their
models is weighted by ``num_examples`` (:func:`~fedcore.legacy.strategy.aggregate.
aggregate`, fedcore's one weighted mean); metrics are aggregated only by
``fit_metrics_aggregation_fn``/``evaluate_metrics_aggregation_fn`` (none by default,
with Flower's warning in round 1); ``evaluate_fn(server_round, ndarrays, {})`` is the
server-side evaluation. With ``accept_failures=False`` a round with any failure is
not aggregated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedcore.domain.array import NDArrays
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import aggregate, aggregate_inplace, weighted_loss_avg
from fedcore.legacy.strategy.strategy import Strategy
from fedcore.legacy.types import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MetricsAggregationFn,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

log = logging.getLogger("flwr")

EvaluateFn = Callable[[int, NDArrays, dict[str, Scalar]], tuple[float, dict[str, Scalar]] | None]
ConfigFn = Callable[[int], dict[str, Scalar]]

MIN_AVAILABLE_CLIENTS_TOO_LOW = (
    "Setting `min_available_clients` lower than `min_fit_clients` or "
    "`min_evaluate_clients` can cause the server to fail when there are too few clients "
    "connected to the server. `min_available_clients` must be set to a value larger "
    "than or equal to the values of `min_fit_clients` and `min_evaluate_clients`."
)


class FedAvg(Strategy):
    """Federated averaging (McMahan et al., 2017), the legacy way."""

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
        inplace: bool = True,
    ) -> None:
        super().__init__()
        if min_fit_clients > min_available_clients or min_evaluate_clients > min_available_clients:
            log.warning(MIN_AVAILABLE_CLIENTS_TOO_LOW)
        self.fraction_fit = fraction_fit
        self.fraction_evaluate = fraction_evaluate
        self.min_fit_clients = min_fit_clients
        self.min_evaluate_clients = min_evaluate_clients
        self.min_available_clients = min_available_clients
        self.evaluate_fn = evaluate_fn
        self.on_fit_config_fn = on_fit_config_fn
        self.on_evaluate_config_fn = on_evaluate_config_fn
        self.accept_failures = accept_failures
        self.initial_parameters = initial_parameters
        self.fit_metrics_aggregation_fn = fit_metrics_aggregation_fn
        self.evaluate_metrics_aggregation_fn = evaluate_metrics_aggregation_fn
        self.inplace = inplace

    def __repr__(self) -> str:
        return f"FedAvg(accept_failures={self.accept_failures})"

    def num_fit_clients(self, num_available_clients: int) -> tuple[int, int]:
        """The training sample size and the clients that must be available first."""
        sample = int(num_available_clients * self.fraction_fit)
        return max(sample, self.min_fit_clients), self.min_available_clients

    def num_evaluation_clients(self, num_available_clients: int) -> tuple[int, int]:
        """The evaluation sample size and the clients that must be available first."""
        sample = int(num_available_clients * self.fraction_evaluate)
        return max(sample, self.min_evaluate_clients), self.min_available_clients

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """``initial_parameters``, handed over once (the strategy lets go of them)."""
        initial, self.initial_parameters = self.initial_parameters, None
        return initial

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        if self.evaluate_fn is None:
            return None
        result = self.evaluate_fn(server_round, parameters_to_ndarrays(parameters), {})
        if result is None:
            return None
        loss, metrics = result
        return loss, metrics

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = {} if self.on_fit_config_fn is None else self.on_fit_config_fn(server_round)
        fit_ins = FitIns(parameters, config)
        size, minimum = self.num_fit_clients(client_manager.num_available())
        clients = client_manager.sample(num_clients=size, min_num_clients=minimum)
        return [(client, fit_ins) for client in clients]

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self.fraction_evaluate == 0.0:
            return []
        config = {}
        if self.on_evaluate_config_fn is not None:
            config = self.on_evaluate_config_fn(server_round)
        evaluate_ins = EvaluateIns(parameters, config)
        size, minimum = self.num_evaluation_clients(client_manager.num_available())
        clients = client_manager.sample(num_clients=size, min_num_clients=minimum)
        return [(client, evaluate_ins) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        if self.inplace:
            mean = aggregate_inplace(results)
        else:
            mean = aggregate(
                [(parameters_to_ndarrays(res.parameters), res.num_examples) for _, res in results]
            )
        return ndarrays_to_parameters(mean), self.fit_metrics(server_round, results)

    def fit_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> dict[str, Scalar]:
        """``fit_metrics_aggregation_fn`` of the ``(num_examples, metrics)`` pairs, or
        nothing (with Flower's warning in round 1)."""
        if self.fit_metrics_aggregation_fn is not None:
            return self.fit_metrics_aggregation_fn(
                [(res.num_examples, res.metrics) for _, res in results]
            )
        if server_round == 1:
            log.warning("No fit_metrics_aggregation_fn provided")
        return {}

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        loss = weighted_loss_avg([(res.num_examples, res.loss) for _, res in results])
        return loss, self.evaluate_metrics(server_round, results)

    def evaluate_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> dict[str, Scalar]:
        """``evaluate_metrics_aggregation_fn`` of the ``(num_examples, metrics)`` pairs,
        or nothing (with Flower's warning in round 1)."""
        if self.evaluate_metrics_aggregation_fn is not None:
            return self.evaluate_metrics_aggregation_fn(
                [(res.num_examples, res.metrics) for _, res in results]
            )
        if server_round == 1:
            log.warning("No evaluate_metrics_aggregation_fn provided")
        return {}
