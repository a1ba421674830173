"""FedYogi (Reddi et al., 2021): Yogi on the server, over the round's pseudo-gradient.

Yogi changes Adam's second moment from an exponential average to an additive move,
``v ← v − (1−β₂) · Δ² · sign(v − Δ²)``: ``v`` grows at least as fast as Adam's
when updates get larger, but shrinks only by ``(1−β₂)Δ²`` when they get smaller,
so the effective step size cannot jump after a few quiet rounds. No bias
correction (as in the paper and Flower 1.42). Defaults are Flower's:
``eta=1e-2, eta_l=0.0316, beta_1=0.9, beta_2=0.99, tau=1e-3``.
"""

from __future__ import annotations

from typing import Unpack

from fedcore.domain.array import NDArray
from fedcore.strategy.fedavg import FedAvgOptions
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import yogi_step


class FedYogi(FedOpt):
    """Adaptive federated optimization with Yogi."""

    def __init__(
        self,
        *,
        eta: float = 1e-2,
        eta_l: float = 0.0316,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-3,
        **options: Unpack[FedAvgOptions],
    ) -> None:
        super().__init__(
            eta=eta,
            eta_l=eta_l,
            beta_1=beta_1,
            beta_2=beta_2,
            tau=tau,
            **options,
        )

    def adaptive_step(
        self, server_round: int, current: NDArray, mean: NDArray, m: NDArray, v: NDArray
    ) -> tuple[NDArray, NDArray, NDArray]:
        return yogi_step(
            current, mean, m, v, eta=self.eta, beta_1=self.beta_1, beta_2=self.beta_2, tau=self.tau
        )
