"""The learning task: digits, a Dirichlet label split, softmax regression with a proximal term.

Deliberately small (a 64×10 linear model trained by minibatch SGD in numpy) so that a
comparison of strategies takes seconds; the split is strongly non-IID (Dirichlet 0.3
by default), which is where the strategies differ. ``proximal_mu`` adds FedProx's
``mu/2 · ‖w − w_global‖²`` to the local objective; it is zero for every other strategy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from fedcore.data import DirichletPartitioner

Arrays = dict[str, np.ndarray]


@lru_cache(maxsize=1)
def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test), the same split in every process."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return x_train, y_train, x_test, y_test


@lru_cache(maxsize=8)
def _partitions(num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    return DirichletPartitioner(num_partitions, alpha=alpha, seed=seed).split(dataset()[1])


def local_data(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """This node's training samples."""
    x_train, y_train, _, _ = dataset()
    indices = _partitions(num_partitions, alpha, seed)[partition_id]
    return x_train[indices], y_train[indices]


def is_slow(partition_id: int, num_partitions: int, slow_fraction: float, seed: int) -> bool:
    """Whether this node is one of the ``slow_fraction`` slow ones (a seeded choice)."""
    order = np.random.default_rng([seed, 7]).permutation(num_partitions)
    return bool(partition_id in order[: round(slow_fraction * num_partitions)])


def initial_model() -> Arrays:
    return {"w": np.zeros((64, 10)), "b": np.zeros(10)}


def _probabilities(model: Arrays, x: np.ndarray) -> np.ndarray:
    logits = x @ model["w"] + model["b"]
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def train(
    model: Arrays,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    proximal_mu: float,
    rng: np.random.Generator,
) -> tuple[Arrays, float]:
    """Minibatch SGD on the cross-entropy (plus the proximal term); new model, mean loss."""
    start = {key: value.copy() for key, value in model.items()}
    w, b = model["w"].copy(), model["b"].copy()
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for first in range(0, len(x), batch_size):
            batch = order[first : first + batch_size]
            probs = _probabilities({"w": w, "b": b}, x[batch])
            rows = np.arange(len(batch))
            losses.append(float(-np.log(probs[rows, y[batch]] + 1e-12).mean()))
            probs[rows, y[batch]] -= 1.0
            w -= lr * (x[batch].T @ probs / len(batch) + proximal_mu * (w - start["w"]))
            b -= lr * (probs.mean(axis=0) + proximal_mu * (b - start["b"]))
    return {"w": w, "b": b}, float(np.mean(losses)) if losses else 0.0


def evaluate(model: Arrays, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(loss, accuracy) of ``model`` on ``(x, y)``."""
    if len(x) == 0:
        return 0.0, 0.0
    probs = _probabilities(model, x)
    loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((probs.argmax(axis=1) == y).mean())
