"""FedAdam (Reddi et al., 2021): Adam on the server, over the round's pseudo-gradient.

The second moment is an exponential average, ``v ← β₂v + (1−β₂)Δ²``, and the step
size carries Adam's bias correction, ``η · √(1 − β₂ᵗ) / (1 − β₁ᵗ)``, so that the
early rounds, whose moments are still close to their zero start, are not damped.
As in Flower 1.42, ``t`` is ``server_round + 1``: keeping that exponent gives the
same models as a Flower run with the same replies. Defaults are Flower's:
``eta=0.1, eta_l=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3``.
"""

from __future__ import annotations

from fedcore.domain.records import NDArray
from fedcore.strategy.fedavg import MetricsAggregation
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import adam_step


class FedAdam(FedOpt):
    """Adaptive federated optimization with Adam."""

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
        return adam_step(
            current,
            mean,
            m,
            v,
            eta=self.eta,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            tau=self.tau,
            t=server_round + 1,
        )
