"""W3: the quickstart-numpy example — digits, 100 nodes, Dirichlet(0.5), 10 per round, 30 rounds.

Reports the wall time of one run and the round-30 server accuracy for seeds 0–4
(the target is a mean of at least 0.65). The floors are the same training in a plain
loop — 30 rounds of 10 randomly chosen partitions, one local epoch each, averaged by
example count — in one process and through a bare process pool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import fedcore as fc
from benchmarks.pool import spawn_pool

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "quickstart-numpy"
SEEDS = range(5)
ROUNDS, NODES, PER_ROUND = 30, 100, 10

sys.path.insert(0, str(EXAMPLE))
from quickstart_numpy import task  # noqa: E402 (the example is an app directory, not a package)


def accuracy(seed: int, backend: str = "process") -> float:
    """The server's test accuracy of the round-30 model."""
    result = fc.run_simulation(EXAMPLE, nodes=NODES, backend=backend, seed=seed)
    _, _, x_test, y_test = task.dataset()
    return task.evaluate(dict(result.value), x_test, y_test)[1]


def run(backend: str) -> None:
    fc.run_simulation(EXAMPLE, nodes=NODES, backend=backend, seed=0)


def _train(job: tuple[task.Arrays, int, int]) -> tuple[task.Arrays, int]:
    model, partition, server_round = job
    x, y = task.local_data(partition, NODES, 0.5, 0)
    rng = np.random.default_rng([0, partition, server_round])
    new, _ = task.train(model, x, y, epochs=1, batch_size=32, lr=0.1, rng=rng)
    return new, len(x)


def _average(results: list[tuple[task.Arrays, int]], model: task.Arrays) -> task.Arrays:
    total = sum(n for _, n in results)
    return {k: sum(new[k] * n for new, n in results) / total for k in model}


def floor() -> None:
    rng = np.random.default_rng(0)
    model = task.initial_model()
    for server_round in range(1, ROUNDS + 1):
        chosen = rng.choice(NODES, size=PER_ROUND, replace=False)
        model = _average([_train((model, int(p), server_round)) for p in chosen], model)


def pool_floor() -> None:
    rng = np.random.default_rng(0)
    model = task.initial_model()
    with spawn_pool() as pool:
        for server_round in range(1, ROUNDS + 1):
            chosen = rng.choice(NODES, size=PER_ROUND, replace=False)
            jobs = [(model, int(p), server_round) for p in chosen]
            model = _average(list(pool.imap(_train, jobs)), model)
