"""The learning task, free of any federated machinery: data, model, training, evaluation.

Digits (8×8 images, 10 classes, 1,797 samples) scaled to [0, 1]; a fixed, stratified
20 % test set for the server; the other 80 % split among the nodes by a
Dirichlet(alpha) label partition. The model is a one-hidden-layer MLP trained with
SGD and momentum on the cross-entropy, on the CPU.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from fedcore.data import DirichletPartitioner

NUM_FEATURES, HIDDEN, NUM_CLASSES = 64, 256, 10


class Net(nn.Module):
    """64 pixels -> 256 ReLU units -> 10 class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(NUM_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def initial_model(seed: int) -> Net:
    """A freshly initialised Net, the same for the same seed, leaving torch's global RNG alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Net()


@lru_cache(maxsize=1)
def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test); the split is the same in every process."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return (
        torch.from_numpy(x_train),
        torch.from_numpy(y_train),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
    )


@lru_cache(maxsize=8)
def _partitions(num_partitions: int, alpha: float, seed: int) -> list[np.ndarray]:
    _, y_train, _, _ = dataset()
    return DirichletPartitioner(num_partitions, alpha=alpha, seed=seed).split(y_train.numpy())


def local_data(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training samples of one node."""
    x_train, y_train, _, _ = dataset()
    indices = torch.from_numpy(_partitions(num_partitions, alpha, seed)[partition_id])
    return x_train[indices], y_train[indices]


def train(
    model: Net,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    rng: np.random.Generator,
) -> float:
    """Train ``model`` in place by minibatch SGD; returns the mean training loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    losses = []
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        for batch in order.split(batch_size):
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses)) if losses else 0.0


@torch.no_grad()
def evaluate(model: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(loss, accuracy) of ``model`` on ``(x, y)``."""
    if len(x) == 0:
        return 0.0, 0.0
    model.eval()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(dim=1) == y).float().mean().item()
