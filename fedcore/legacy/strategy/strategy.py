"""``Strategy``: the legacy server's strategy interface, as Flower's ``flwr.server.strategy``.

A legacy strategy works on ``Parameters`` and ``ClientProxy`` objects instead of
ArrayRecords and Messages: the legacy ``Server`` asks it for the clients and
instructions of each round (``configure_fit``/``configure_evaluate``) and hands it
the clients' answers (``aggregate_fit``/``aggregate_evaluate``). Users subclass it, or
one of the strategies of this package, and call ``super()`` as they do with Flower's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.types import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar


class Strategy(ABC):
    """What the legacy server asks of a strategy, round by round."""

    @abstractmethod
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The initial global model, or ``None`` to have the server ask a client for it."""

    @abstractmethod
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The clients to train in round ``server_round``, each with its instructions."""

    @abstractmethod
    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """The new global model (``None``: keep the old one) and the round's metrics."""

    @abstractmethod
    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The clients to evaluate in round ``server_round``, each with its instructions."""

    @abstractmethod
    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """The round's federated loss (``None``: none) and metrics."""

    @abstractmethod
    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """The server-side (centralised) loss and metrics of ``parameters``, or ``None``."""
