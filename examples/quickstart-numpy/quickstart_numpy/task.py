"""The learning task, free of any federated machinery: data, model, training, evaluation.

Digits (8×8 images, 10 classes, 1,797 samples) scaled to [0, 1]; a fixed, stratified
20 % test set for the server; the other 80 % split among the nodes by a
Dirichlet(alpha) label partition. The model is multinomial logistic regression:
``softmax(x @ w + b)``, trained with minibatch SGD on the cross-entropy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from fedcore.data import DirichletPartitioner

NUM_FEATURES, NUM_CLASSES = 64, 10
Arrays = dict[str, np.ndarray]


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
def _partitions(num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    _, y_train, _, _ = dataset()
    return DirichletPartitioner(num_partitions, alpha=alpha, seed=seed).split(y_train)


def local_data(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The training samples of one node."""
    x_train, y_train, _, _ = dataset()
    indices = _partitions(num_partitions, alpha, seed)[partition_id]
    return x_train[indices], y_train[indices]


def initial_model() -> Arrays:
    return {"w": np.zeros((NUM_FEATURES, NUM_CLASSES)), "b": np.zeros(NUM_CLASSES)}


def _probabilities(model: Arrays, x: np.ndarray) -> np.ndarray:
    logits = x @ model["w"] + model["b"]
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def train(
    model: Arrays,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
) -> tuple[Arrays, float]:
    """SGD on the cross-entropy; returns the new model and the mean training loss."""
    w, b = model["w"].copy(), model["b"].copy()
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            batch = order[start : start + batch_size]
            probs = _probabilities({"w": w, "b": b}, x[batch])
            losses.append(-np.log(probs[np.arange(len(batch)), y[batch]] + 1e-12).mean())
            probs[np.arange(len(batch)), y[batch]] -= 1.0
            w -= lr * x[batch].T @ probs / len(batch)
            b -= lr * probs.mean(axis=0)
    return {"w": w, "b": b}, float(np.mean(losses)) if losses else 0.0


def evaluate(model: Arrays, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(loss, accuracy) of ``model`` on ``(x, y)``."""
    if len(x) == 0:
        return 0.0, 0.0
    probs = _probabilities(model, x)
    loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
    return loss, float((probs.argmax(axis=1) == y).mean())
