"""Strategies: pure configure/aggregate methods plus one round driver (``start``)."""

from fedcore.strategy.base import Strategy
from fedcore.strategy.bulyan import Bulyan
from fedcore.strategy.dp_fixed_clipping import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from fedcore.strategy.fedadagrad import FedAdagrad
from fedcore.strategy.fedadam import FedAdam
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.fedavgm import FedAvgM
from fedcore.strategy.fedbuff import FedBuff
from fedcore.strategy.fedmedian import FedMedian
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.fedprox import FedProx
from fedcore.strategy.fedtrimmedavg import FedTrimmedAvg
from fedcore.strategy.fedyogi import FedYogi
from fedcore.strategy.krum import Krum
from fedcore.strategy.multikrum import MultiKrum
from fedcore.strategy.qfedavg import QFedAvg
from fedcore.strategy.result import Result, RoundReport

__all__ = [
    "Bulyan",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideFixedClipping",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedBuff",
    "FedMedian",
    "FedOpt",
    "FedProx",
    "FedTrimmedAvg",
    "FedYogi",
    "Krum",
    "MultiKrum",
    "QFedAvg",
    "Result",
    "RoundReport",
    "Strategy",
]
