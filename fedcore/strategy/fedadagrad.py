"""FedAdagrad (Reddi et al., 2021): Adagrad on the server, over the round's pseudo-gradient.

The second moment sums every round's squared pseudo-gradient, ``v ← v + Δ²``, so
each coordinate's step size only shrinks — coordinates that keep moving slow down
the most. As in Flower 1.42 there is no momentum (``beta_1`` is fixed at 0, so the
step follows this round's ``Δ``) and no ``beta_1``/``beta_2`` argument. Defaults
are Flower's: ``eta=0.1, eta_l=0.1, tau=1e-3``.
"""

from __future__ import annotations

from fedcore.domain.records import NDArray
from fedcore.strategy.fedavg import MetricsAggregation
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import adagrad_step


class FedAdagrad(FedOpt):
    """Adaptive federated optimization with Adagrad."""

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
        tau: float = 1e-3,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            eta=eta,
            eta_l=eta_l,
            beta_1=0.0,
            beta_2=0.0,
            tau=tau,
        )

    def adaptive_step(
        self, server_round: int, current: NDArray, mean: NDArray, m: NDArray, v: NDArray
    ) -> tuple[NDArray, NDArray, NDArray]:
        return adagrad_step(current, mean, m, v, eta=self.eta, beta_1=self.beta_1, tau=self.tau)
