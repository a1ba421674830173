"""Legacy ``FedProx`` (Li et al., 2020): FedAvg that sends ``proximal_mu`` in each fit config.

The clients add the proximal term ``μ/2 · ‖w − w_global‖²`` to their loss; the server
side is FedAvg's mean.
"""

from __future__ import annotations

from typing import Any

from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.types import FitIns, Parameters


class FedProx(FedAvg):
    """FedAvg whose training config carries ``proximal_mu``."""

    def __init__(self, *, proximal_mu: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.proximal_mu = proximal_mu

    def __repr__(self) -> str:
        return f"FedProx(accept_failures={self.accept_failures})"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return [
            (client, FitIns(ins.parameters, {**ins.config, "proximal_mu": self.proximal_mu}))
            for client, ins in super().configure_fit(server_round, parameters, client_manager)
        ]
