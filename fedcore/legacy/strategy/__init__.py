"""Flower's legacy strategies (``flwr.server.strategy``), each a thin layer on fedcore's rules.

A legacy strategy keeps Flower's interface — ``Parameters`` in, ``(ClientProxy,
FitRes)`` pairs back, ``super().aggregate_fit(...)`` in a subclass — and computes
with the aggregation rule of :mod:`fedcore.strategy` that its Message-API twin uses
(through :mod:`fedcore.legacy.strategy.aggregate`, Flower's function names), so each
rule has one implementation.
"""

from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.strategy.strategy import Strategy

__all__ = ["FedAvg", "Strategy"]
