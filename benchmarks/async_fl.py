"""Asynchronous FL: FedBuff against FedAvg in wall time to 0.70 accuracy, with stragglers.

The strategy-comparison example on 30 nodes, Dirichlet(0.5): a seeded third of the
nodes take 10× longer (0.5 s instead of 0.05 s) per training message. FedAvg samples
10 nodes a round and so waits for a slow one almost every round; FedBuff keeps 10
training and steps every 5 replies. Reported: seconds until the server's test
accuracy first reaches 0.70 (issue 4's mark) and 0.85, and the accuracy after 30
rounds (steps).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "strategy-comparison"
STRATEGIES = ("fedavg", "fedbuff")
TARGETS = (0.70, 0.85)

sys.path.insert(0, str(EXAMPLE))
from compare import race  # noqa: E402 (the example is an app directory, not a package)


def rows() -> list[dict[str, Any]]:
    runs = [race(name, nodes=30, rounds=30) for name in STRATEGIES]
    return [
        {
            "strategy": run.strategy,
            "seconds": run.seconds,
            "final_accuracy": run.final_accuracy,
            "seconds_to": {
                str(target): None if point is None else point.seconds
                for target in TARGETS
                for point in [run.reached(target)]
            },
        }
        for run in runs
    ]
