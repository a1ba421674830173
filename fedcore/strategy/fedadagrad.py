"""FedAdagrad (Reddi et al., 2021): Adagrad on the server, over the round's pseudo-gradient.

The second moment sums every round's squared pseudo-gradient, ``v ← v + Δ²``, so
each coordinate's step size only shrinks — coordinates that keep moving slow down
the most. As in Flower 1.42 there is no momentum (``beta_1`` is fixed at 0, so the
step follows this round's ``Δ``) and no ``beta_1``/``beta_2`` argument. Defaults
are Flower's: ``eta=0.1, eta_l=0.1, tau=1e-3``.
"""

from __future__ import annotations

from typing import Unpack

from fedcore.domain.array import NDArray
from fedcore.strategy.fedavg import FedAvgOptions
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.optimizers import adagrad_step


class FedAdagrad(FedOpt):
    """Adaptive federated optimization with Adagrad."""

    def __init__(
        self,
        *,
        eta: float = 1e-1,
        eta_l: float = 1e-1,
        tau: float = 1e-3,
        **options: Unpack[FedAvgOptions],
    ) -> None:
        super().__init__(
            eta=eta,
            eta_l=eta_l,
            beta_1=0.0,
            beta_2=0.0,
            tau=tau,
            **options,
        )

    def adaptive_step(
        self, server_round: int, current: NDArray, mean: NDArray, m: NDArray, v: NDArray
    ) -> tuple[NDArray, NDArray, NDArray]:
        return adagrad_step(current, mean, m, v, eta=self.eta, beta_1=self.beta_1, tau=self.tau)
