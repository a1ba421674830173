"""Flower's legacy strategies (``flwr.server.strategy``), each a thin layer on fedcore's rules.

A legacy strategy keeps Flower's interface — ``Parameters`` in, ``(ClientProxy,
FitRes)`` pairs back, ``super().aggregate_fit(...)`` in a subclass — and computes
with the aggregation rule of :mod:`fedcore.strategy` that its Message-API twin uses
(through :mod:`fedcore.legacy.strategy.aggregate`, Flower's function names), so each
rule has one implementation.
"""

from fedcore.legacy.strategy.dp_clipping import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from fedcore.legacy.strategy.dpfedavg import DPFedAvgAdaptive, DPFedAvgFixed
from fedcore.legacy.strategy.fault_tolerant_fedavg import FaultTolerantFedAvg
from fedcore.legacy.strategy.fedavg import FedAvg
from fedcore.legacy.strategy.fedavg_android import FedAvgAndroid
from fedcore.legacy.strategy.fedavgm import FedAvgM
from fedcore.legacy.strategy.fedopt import FedAdagrad, FedAdam, FedOpt, FedYogi
from fedcore.legacy.strategy.fedprox import FedProx
from fedcore.legacy.strategy.qfedavg import QFedAvg
from fedcore.legacy.strategy.robust import Bulyan, FedMedian, FedTrimmedAvg, Krum
from fedcore.legacy.strategy.strategy import Strategy
from fedcore.legacy.strategy.xgboost import FedXgbBagging, FedXgbCyclic, FedXgbNnAvg

__all__ = [
    "Bulyan",
    "DPFedAvgAdaptive",
    "DPFedAvgFixed",
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "DifferentialPrivacyServerSideFixedClipping",
    "FaultTolerantFedAvg",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgAndroid",
    "FedAvgM",
    "FedMedian",
    "FedOpt",
    "FedProx",
    "FedTrimmedAvg",
    "FedXgbBagging",
    "FedXgbCyclic",
    "FedXgbNnAvg",
    "FedYogi",
    "Krum",
    "QFedAvg",
    "Strategy",
]
