"""FedAdam (Reddi et al., 2021): Adam on the server, over the round's pseudo-gradient.

The second moment is an exponential average, ``v ← β₂v + (1−β₂)Δ²``, and the step
size carries Adam's bias correction, ``η · √(1 − β₂ᵗ) / (1 − β₁ᵗ)``, so that the
early rounds, whose moments are still close to their zero start, are not damped.
As in Flower 1.42, ``t`` is ``server_round + 1``: keeping that exponent gives the
same models as a Flower run with the same replies. Defaults are Flower's:
``eta=0.1, eta_l=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3``.
"""

from __future__ import annotations

from typing import Unpack

from fedcore.domain.array import NDArray
from fedcore.strategy.fedavg import FedAvgOptions
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import adam_step


class FedAdam(FedOpt):
    """Adaptive federated optimization with Adam."""

    def __init__(
        self,
        *,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
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
