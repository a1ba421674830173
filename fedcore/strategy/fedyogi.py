"""FedYogi (Reddi et al., 2021): Yogi on the server, over the round's pseudo-gradient.

Yogi changes Adam's second moment from an exponential average to an additive move,
``v ← v − (1−β₂) · Δ² · sign(v − Δ²)``: ``v`` grows at least as fast as Adam's
when updates get larger, but shrinks only by ``(1−β₂)Δ²`` when they get smaller,
so the effective step size cannot jump after a few quiet rounds. No bias
correction (as in the paper and Flower 1.42). Defaults are Flower's:
``eta=1e-2, eta_l=0.0316, beta_1=0.9, beta_2=0.99, tau=1e-3``.
"""

from __future__ import annotations

from fedcore.domain.records import NDArray
from fedcore.strategy.fedavg import MetricsAggregation
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import yogi_step


class FedYogi(FedOpt):
    """Adaptive federated optimization with Yogi."""

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
        eta: float = 1e-2,
        eta_l: float = 0.0316,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
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
            beta_1=beta_1,
            beta_2=beta_2,
            tau=tau,
        )

    def adaptive_step(
        self, server_round: int, current: NDArray, mean: NDArray, m: NDArray, v: NDArray
    ) -> tuple[NDArray, NDArray, NDArray]:
        return yogi_step(
            current, mean, m, v, eta=self.eta, beta_1=self.beta_1, beta_2=self.beta_2, tau=self.tau
        )
