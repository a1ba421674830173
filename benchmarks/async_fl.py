"""Asynchronous FL: FedBuff against FedAvg in wall time to 0.70 accuracy, with stragglers.

The strategy-comparison example on 30 nodes, Dirichlet(0.5): a seeded third of the
nodes take 10× longer (0.5 s instead of 0.05 s) per training message. FedAvg samples
10 nodes a round and so waits for a slow one almost every round; FedBuff keeps 10
training and steps every 5 replies. Reported: seconds until the server's test
accuracy first reaches 0.70, and the accuracy after 30 rounds (steps).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "strategy-comparison"
STRATEGIES = ("fedavg", "fedbuff")
TARGET = 0.70

sys.path.insert(0, str(EXAMPLE))
from compare import race  # noqa: E402 (the example is an app directory, not a package)


def rows() -> list[dict[str, Any]]:
    return [
        {
            "strategy": name,
            "seconds_to_target": row.seconds_to_target,
            "rounds_to_target": row.rounds_to_target,
            "final_accuracy": row.final_accuracy,
            "seconds": row.seconds,
        }
        for name in STRATEGIES
        for row in [race(name, nodes=30, rounds=30, target=TARGET)]
    ]
