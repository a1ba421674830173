"""Legacy ``QFedAvg`` (Li et al., 2020): the q-FFL step of fedcore's Message-API q-FedAvg.

Unlike fedcore's ``QFedAvg``, which weighs each node by the training loss it reports,
Flower's legacy ``QFedAvg`` uses one loss for every client: the server-side loss of
the model sent (``evaluate_fn``); it is kept here (docs/from-flower.md), and without
an ``evaluate_fn`` the round cannot be aggregated (``ValueError``; Flower's fails on
an unbound variable).
"""

from __future__ import annotations

from typing import Any

from fedcore.domain.array import NDArrays
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.types import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from fedcore.strategy.optimizers import qffl_step


class QFedAvg(FedAvg):
    """q-Fair federated averaging."""

    def __init__(
        self, *, q_param: float = 0.2, qffl_learning_rate: float = 0.1, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.learning_rate = qffl_learning_rate
        self.q_param = q_param
        self.pre_weights: NDArrays | None = None

    def __repr__(self) -> str:
        return (
            f"QffedAvg(learning_rate={self.learning_rate}, q_param={self.q_param}, "
            f"pre_weights={self.pre_weights})"
        )

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self.pre_weights = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results or (failures and not self.accept_failures):
            return None, {}
        if self.pre_weights is None:
            raise ValueError("QFedAvg has no model to step from: call configure_fit first")
        evaluated = self.evaluate(server_round, ndarrays_to_parameters(self.pre_weights))
        if evaluated is None:
            raise ValueError("QFedAvg needs evaluate_fn: its step weighs clients by that loss")
        loss = float(evaluated[0])
        current = {str(i): layer for i, layer in enumerate(self.pre_weights)}
        local_models = (
            (dict(zip(current, parameters_to_ndarrays(res.parameters), strict=True)), loss)
            for _, res in results
        )
        new = qffl_step(current, local_models, q=self.q_param, learning_rate=self.learning_rate)
        return ndarrays_to_parameters(list(new.values())), self.fit_metrics(server_round, results)
