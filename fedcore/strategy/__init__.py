"""Strategies: pure configure/aggregate methods, driven by ``start`` on the synchronous
round driver (:mod:`.rounds`) or, for FedBuff, the asynchronous one (:mod:`.async_rounds`).

Each name is imported from its module on first use: an app that runs FedAvg does not
load the other fifteen strategies, in its ServerApp nor in every worker that imports
its module.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.strategy.base import Strategy
    from fedcore.strategy.bulyan import Bulyan
    from fedcore.strategy.dp_adaptive_clipping import (
        DifferentialPrivacyClientSideAdaptiveClipping,
        DifferentialPrivacyServerSideAdaptiveClipping,
    )
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
    from fedcore.strategy.fedxgb_bagging import FedXgbBagging
    from fedcore.strategy.fedxgb_cyclic import FedXgbCyclic
    from fedcore.strategy.fedyogi import FedYogi
    from fedcore.strategy.krum import Krum
    from fedcore.strategy.multikrum import MultiKrum
    from fedcore.strategy.qfedavg import QFedAvg
    from fedcore.strategy.result import Result, RoundReport

__all__ = [
    "Bulyan",
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
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
    "FedXgbBagging",
    "FedXgbCyclic",
    "FedYogi",
    "Krum",
    "MultiKrum",
    "QFedAvg",
    "Result",
    "RoundReport",
    "Strategy",
]

_MODULES = {
    "base": ("Strategy",),
    "bulyan": ("Bulyan",),
    "dp_adaptive_clipping": (
        "DifferentialPrivacyClientSideAdaptiveClipping",
        "DifferentialPrivacyServerSideAdaptiveClipping",
    ),
    "dp_fixed_clipping": (
        "DifferentialPrivacyClientSideFixedClipping",
        "DifferentialPrivacyServerSideFixedClipping",
    ),
    "fedadagrad": ("FedAdagrad",),
    "fedadam": ("FedAdam",),
    "fedavg": ("FedAvg",),
    "fedavgm": ("FedAvgM",),
    "fedbuff": ("FedBuff",),
    "fedmedian": ("FedMedian",),
    "fedopt": ("FedOpt",),
    "fedprox": ("FedProx",),
    "fedtrimmedavg": ("FedTrimmedAvg",),
    "fedxgb_bagging": ("FedXgbBagging",),
    "fedxgb_cyclic": ("FedXgbCyclic",),
    "fedyogi": ("FedYogi",),
    "krum": ("Krum",),
    "multikrum": ("MultiKrum",),
    "qfedavg": ("QFedAvg",),
    "result": ("Result", "RoundReport"),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
