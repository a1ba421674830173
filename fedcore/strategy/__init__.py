"""Strategies: pure configure/aggregate methods plus one round driver (``start``)."""

from fedcore.strategy.base import Strategy
from fedcore.strategy.bulyan import Bulyan
from fedcore.strategy.dp_fixed_clipping import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.fedbuff import FedBuff
from fedcore.strategy.fedmedian import FedMedian
from fedcore.strategy.fedtrimmedavg import FedTrimmedAvg
from fedcore.strategy.krum import Krum
from fedcore.strategy.multikrum import MultiKrum
from fedcore.strategy.result import Result, RoundReport

__all__ = [
    "Bulyan",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideFixedClipping",
    "FedAvg",
    "FedBuff",
    "FedMedian",
    "FedTrimmedAvg",
    "Krum",
    "MultiKrum",
    "Result",
    "RoundReport",
    "Strategy",
]
