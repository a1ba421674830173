"""Run one benchmark case in this process and print its figures as one JSON line.

``python -m benchmarks.run W2 inline`` — used by ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import logging
import sys
from statistics import mean
from typing import Any

from benchmarks import w2, w3
from benchmarks.measure import timed

WORKLOADS = {"W2": w2, "W3": w3}


def case(workload: str, variant: str) -> dict[str, Any]:
    module = WORKLOADS[workload]
    row: dict[str, Any] = {"workload": workload, "variant": variant}
    if variant == "accuracy":
        accuracies = [w3.accuracy(seed) for seed in w3.SEEDS]
        return row | {"accuracies": accuracies, "mean": mean(accuracies)}
    work = module.floor if variant == "floor" else lambda: module.run(variant)
    measurement = timed(work)
    return row | {
        "seconds": measurement.seconds,
        "peak_bytes": measurement.peak_bytes,
        "memory": measurement.method,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(case(*sys.argv[1:])))
