"""Strategies: pure configure/aggregate methods plus one round driver (``start``)."""

from fedcore.strategy.base import Strategy
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.fedbuff import FedBuff
from fedcore.strategy.result import Result, RoundReport

__all__ = ["FedAvg", "FedBuff", "Result", "RoundReport", "Strategy"]
