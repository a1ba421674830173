"""W3: the quickstart-numpy example — digits, 100 nodes, Dirichlet(0.5), 10 per round, 30 rounds.

Reports the wall time of one run and the round-30 server accuracy for seeds 0–4
(the issue asks for a mean of at least 0.65). The floor is the same training in a
plain loop: 30 rounds of 10 randomly chosen partitions, one local epoch each,
averaged by example count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import fedcore as fc

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "quickstart-numpy"
SEEDS = range(5)


def accuracy(seed: int, backend: str = "inline") -> float:
    """The server's test accuracy of the round-30 model."""
    result = fc.run_simulation(EXAMPLE, nodes=100, backend=backend, seed=seed)
    from quickstart_numpy import task  # importable once the app directory is loaded

    _, _, x_test, y_test = task.dataset()
    return task.evaluate(dict(result.value), x_test, y_test)[1]


def run(backend: str) -> None:
    fc.run_simulation(EXAMPLE, nodes=100, backend=backend, seed=0)


def floor() -> None:
    sys.path.insert(0, str(EXAMPLE))
    from quickstart_numpy import task

    rng = np.random.default_rng(0)
    model = task.initial_model()
    for server_round in range(1, 31):
        updates, weights = [], []
        for partition in rng.choice(100, size=10, replace=False):
            x, y = task.local_data(int(partition), 100, 0.5, 0)
            local_rng = np.random.default_rng([0, int(partition), server_round])
            new, _ = task.train(model, x, y, epochs=1, batch_size=32, lr=0.1, rng=local_rng)
            updates.append(new)
            weights.append(len(x))
        total = sum(weights)
        model = {
            k: sum(u[k] * w for u, w in zip(updates, weights, strict=True)) / total for k in model
        }
