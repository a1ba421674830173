"""Run one benchmark case in this process and print its figures as one JSON line.

``python -m benchmarks.run W2 process`` — used by ``python -m benchmarks``. Variants:
``floor`` (one process, no orchestration), ``pool`` (a bare process pool), a backend
name, ``cli`` (W2 only: ``fedcore simulate`` of the app as a whole process, start-up
included), ``accuracy`` (W3 only) or ``race`` (async: FedBuff against FedAvg). The
``deploy`` workload's variants are its cases (benchmarks/deployment.py): ``rounds``,
``w1-50``, ``w1-50-sqlite``, ``heartbeats``, ``heartbeats-5s``, ``large``, ``large-memory`` and
``large-400``. W4 and W4-torch (benchmarks/w4.py) run ``floor``, ``capped`` and
``uncapped``, each with its own thread variables, set here before anything loads
numpy: ``floor`` at one thread, ``capped`` with none (fedcore's cap applies),
``uncapped`` at the machine's cores (a user's choice, which fedcore keeps); each also
as ``floor-cli``, ``capped-cli`` and ``uncapped-cli``, a whole process. The
``startup`` workload has one case, ``help`` (benchmarks/startup.py), and so has
``install``, ``demo-cold`` (benchmarks/install.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from statistics import mean
from typing import Any

from benchmarks.measure import timed

# Imported on demand: a spawn pool's workers re-import this module, and should not pay
# for the other workloads' imports (W3 brings in scikit-learn).
WORKLOADS = {
    "W1": "benchmarks.w1",
    "W2": "benchmarks.w2",
    "W3": "benchmarks.w3",
    "100k": "benchmarks.scale",
    "async": "benchmarks.async_fl",
    "deploy": "benchmarks.deployment",
    "W4": "benchmarks.w4",
    "W4-torch": "benchmarks.w4_torch",
    "startup": "benchmarks.startup",
    "install": "benchmarks.install",
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""fedcore's (fedcore.workers.threads), named here because importing that
module loads the simulation package, and with it numpy, which reads them; checked
against fedcore's once it is imported."""


def _set_threads(variant: str) -> None:
    """The thread variables a W4 variant runs with, set before numpy loads."""
    threads = {"floor": "1", "capped": None, "uncapped": str(len(os.sched_getaffinity(0)))}
    for name in THREAD_VARIABLES:
        os.environ.pop(name, None)
        if threads[variant] is not None:
            os.environ[name] = threads[variant]


def case(workload: str, variant: str) -> dict[str, Any]:
    if workload.startswith("W4"):
        _set_threads(variant.removesuffix("-cli"))
    module = importlib.import_module(WORKLOADS[workload])
    row: dict[str, Any] = {"workload": workload, "variant": variant}
    if workload.startswith("W4"):
        from fedcore.workers import threads

        assert threads.THREAD_VARIABLES == THREAD_VARIABLES
        row["workers"] = module.workers()
    if variant == "accuracy":
        accuracies = [module.accuracy(seed) for seed in module.SEEDS]
        return row | {"accuracies": accuracies, "mean": mean(accuracies)}
    if variant == "race":
        return row | {"race": module.rows()}
    if workload in ("deploy", "startup", "install"):
        figures: dict[str, Any] = module.case(variant)
        return row | figures
    work: Callable[[], None]
    if variant == "floor":
        work = module.floor
    elif variant == "pool":
        work = module.pool_floor
    elif workload.startswith("W4") and variant.endswith("-cli"):
        work = lambda: module.cli(variant)  # noqa: E731
    elif workload.startswith("W4"):
        work = lambda: row.update(rounds_seconds=module.run(variant))  # noqa: E731
    elif variant == "cli":
        work = module.cli
    else:
        work = lambda: module.run(variant)  # noqa: E731
    measurement = timed(work)
    if workload.startswith("W4"):
        row["load_average"] = os.getloadavg()[0]  # the machine's other work skews the ratios
    return row | {
        "seconds": measurement.seconds,
        "peak_bytes": measurement.peak_bytes,
        "memory": measurement.method,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(case(*sys.argv[1:])))
