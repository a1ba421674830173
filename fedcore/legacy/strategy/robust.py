"""Legacy ``FedMedian``, ``FedTrimmedAvg``, ``Krum`` and ``Bulyan``: FedAvg's sampling
and callbacks, with a robust rule of :mod:`fedcore.strategy.aggregate` instead of the mean.

As Flower's legacy classes, they compute with the functions of
:mod:`fedcore.legacy.strategy.aggregate` and let ``fit_metrics_aggregation_fn``
aggregate the metrics of every result (fedcore's Message-API Krum and Bulyan take
the metrics of the selected replies only).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from fedcore.domain.array import NDArrays
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.aggregate import (
    aggregate_bulyan,
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.types import (
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)


class _RobustFedAvg(FedAvg):
    """FedAvg whose mean is replaced by :meth:`rule` on ``(ndarrays, num_examples)`` pairs."""

    @abstractmethod
    def rule(self, results: list[tuple[NDArrays, int]]) -> NDArrays:
        """The new global model from the clients' ``(ndarrays, num_examples)``."""

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        models = [(parameters_to_ndarrays(res.parameters), res.num_examples) for _, res in results]
        return ndarrays_to_parameters(self.rule(models)), self.fit_metrics(server_round, results)


class FedMedian(_RobustFedAvg):
    """The coordinate-wise median of the clients' models (Yin et al., 2018)."""

    def __repr__(self) -> str:
        return f"FedMedian(accept_failures={self.accept_failures})"

    def rule(self, results: list[tuple[NDArrays, int]]) -> NDArrays:
        return aggregate_median(results)


class FedTrimmedAvg(_RobustFedAvg):
    """The coordinate-wise mean without the ``beta`` fraction of extremes on each side."""

    def __init__(self, *, beta: float = 0.2, **kwargs: Any) -> None:
        if not 0.0 <= beta < 0.5:
            raise ValueError("`beta` must be in the range [0, 0.5).")
        super().__init__(**kwargs)
        self.beta = beta

    def __repr__(self) -> str:
        return f"FedTrimmedAvg(accept_failures={self.accept_failures})"

    def rule(self, results: list[tuple[NDArrays, int]]) -> NDArrays:
        return aggregate_trimmed_avg(results, self.beta)


class Krum(_RobustFedAvg):
    """Krum (Blanchard et al., 2017); with ``num_clients_to_keep > 0``, Multi-Krum."""

    def __init__(
        self, *, num_malicious_clients: int = 0, num_clients_to_keep: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_malicious_clients = num_malicious_clients
        self.num_clients_to_keep = num_clients_to_keep

    def __repr__(self) -> str:
        return f"Krum(accept_failures={self.accept_failures})"

    def rule(self, results: list[tuple[NDArrays, int]]) -> NDArrays:
        return aggregate_krum(results, self.num_malicious_clients, self.num_clients_to_keep)


class Bulyan(_RobustFedAvg):
    """Bulyan (El Mhamdi et al., 2018): repeated Krum, then the mean around the median."""

    def __init__(
        self,
        *,
        num_malicious_clients: int = 0,
        first_aggregation_rule: Callable[..., NDArrays] = aggregate_krum,
        **kwargs: Any,
    ) -> None:
        rule_kwargs = {key: kwargs.pop(key) for key in list(kwargs) if key not in _FEDAVG_ARGS}
        super().__init__(**kwargs)
        self.num_malicious_clients = num_malicious_clients
        self.first_aggregation_rule = first_aggregation_rule
        self.aggregation_rule_kwargs = rule_kwargs

    def __repr__(self) -> str:
        return f"Bulyan(accept_failures={self.accept_failures})"

    def rule(self, results: list[tuple[NDArrays, int]]) -> NDArrays:
        return aggregate_bulyan(
            results,
            self.num_malicious_clients,
            self.first_aggregation_rule,
            **self.aggregation_rule_kwargs,
        )


_FEDAVG_ARGS = frozenset(
    (
        "fraction_fit",
        "fraction_evaluate",
        "min_fit_clients",
        "min_evaluate_clients",
        "min_available_clients",
        "evaluate_fn",
        "on_fit_config_fn",
        "on_evaluate_config_fn",
        "accept_failures",
        "initial_parameters",
        "fit_metrics_aggregation_fn",
        "evaluate_metrics_aggregation_fn",
        "inplace",
    )
)
"""Legacy FedAvg's keyword arguments; Bulyan passes any other to its first rule."""
