"""``ServerConfig`` and ``ServerAppComponents``: what a legacy ``server_fn`` returns.

A legacy ServerApp is built from these: ``server_fn(context)`` returns the
components, and the legacy ``ServerApp`` runs ``server.fit(config.num_rounds,
config.round_timeout)`` with them (:mod:`fedcore.legacy.server_app`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedcore.legacy.client_manager import ClientManager
    from fedcore.legacy.server import Server
    from fedcore.legacy.strategy import Strategy


@dataclass
class ServerConfig:
    """How many rounds, and how long each client call of a round may take (None: no limit)."""

    num_rounds: int = 1
    round_timeout: float | None = None

    def __repr__(self) -> str:
        timeout = (
            "no round_timeout"
            if self.round_timeout is None
            else f"round_timeout={self.round_timeout}s"
        )
        return f"num_rounds={self.num_rounds}, {timeout}"


@dataclass
class ServerAppComponents:
    """A legacy ServerApp's parts; each left out gets Flower's default (a ``Server`` over a
    ``SimpleClientManager``, the legacy ``FedAvg``, one round)."""

    server: Server | None = None
    config: ServerConfig | None = None
    strategy: Strategy | None = None
    client_manager: ClientManager | None = None
