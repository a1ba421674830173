"""The MLP of benchmarks/w4.py: 64-HIDDEN-10 ReLU, minibatch SGD on the cross-entropy.

The digits' 1,437 training images split 100 ways would leave 14 per node, too few to
compute anything, so each node holds its own draw of ``samples`` of them (seeded by
its partition id), the same in every process.
"""

from functools import lru_cache

import numpy as np
from sklearn.datasets import load_digits


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target


def local_data(partition: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = digits()
    chosen = np.random.default_rng([4, partition]).choice(len(x), samples, replace=False)
    return x[chosen], y[chosen]


def initial_model(hidden: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((64, hidden)) * np.sqrt(2 / 64)).astype(np.float32),
        np.zeros(hidden, np.float32),
        (rng.standard_normal((hidden, 10)) * np.sqrt(1 / hidden)).astype(np.float32),
        np.zeros(10, np.float32),
    ]


def train(
    model: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """``epochs`` of SGD on ``(x, y)``; the new model."""
    w1, b1, w2, b2 = (array.copy() for array in model)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            xb, yb = x[order[start : start + batch_size]], y[order[start : start + batch_size]]
            hidden = np.maximum(xb @ w1 + b1, 0)
            logits = hidden @ w2 + b2
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            probs[np.arange(len(yb)), yb] -= 1
            probs /= len(yb)
            back = (probs @ w2.T) * (hidden > 0)
            w2 -= lr * hidden.T @ probs
            b2 -= lr * probs.sum(axis=0)
            w1 -= lr * xb.T @ back
            b1 -= lr * back.sum(axis=0)
    return [w1, b1, w2, b2]


def accuracy(model: list[np.ndarray]) -> float:
    """The model's accuracy on all the digits (a check that training did its work)."""
    x, y = digits()
    w1, b1, w2, b2 = model
    return float(((np.maximum(x @ w1 + b1, 0) @ w2 + b2).argmax(axis=1) == y).mean())
