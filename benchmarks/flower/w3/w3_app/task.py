"""Data, model, training and evaluation: digits, multinomial logistic regression, SGD.

The same task as examples/quickstart-numpy/quickstart_numpy/task.py, except that the
Dirichlet(alpha) label split is done here in numpy (that example uses
fedcore.data.DirichletPartitioner, which Flower's environment does not have).
"""

from functools import lru_cache

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

NUM_FEATURES, NUM_CLASSES = 64, 10


@lru_cache(maxsize=1)
def dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test); the split is the same in every process."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return x_train, y_train, x_test, y_test


@lru_cache(maxsize=8)
def partitions(num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Each class's samples shared out by proportions drawn from Dirichlet(alpha)."""
    _, y_train, _, _ = dataset()
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_partitions)]
    for label in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(y_train == label))
        shares = rng.dirichlet(np.full(num_partitions, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for part, chunk in zip(parts, np.split(members, cuts), strict=True):
            part.extend(chunk.tolist())
    return [np.sort(np.array(part, dtype=np.int64)) for part in parts]


def local_data(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    x_train, y_train, _, _ = dataset()
    indices = partitions(num_partitions, alpha, seed)[partition_id]
    return x_train[indices], y_train[indices]


def initial_model() -> list[np.ndarray]:
    return [np.zeros((NUM_FEATURES, NUM_CLASSES)), np.zeros(NUM_CLASSES)]


def _probabilities(w: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def train(
    model: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], float]:
    """SGD on the cross-entropy; the new model and the mean training loss."""
    w, b = model[0].copy(), model[1].copy()
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            batch = order[start : start + batch_size]
            probs = _probabilities(w, b, x[batch])
            losses.append(-np.log(probs[np.arange(len(batch)), y[batch]] + 1e-12).mean())
            probs[np.arange(len(batch)), y[batch]] -= 1.0
            w -= lr * x[batch].T @ probs / len(batch)
            b -= lr * probs.mean(axis=0)
    return [w, b], float(np.mean(losses)) if losses else 0.0


def evaluate(model: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(loss, accuracy) of ``model`` on ``(x, y)``."""
    if len(x) == 0:
        return 0.0, 0.0
    probs = _probabilities(model[0], model[1], x)
    loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((probs.argmax(axis=1) == y).mean())
