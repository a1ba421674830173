"""W4 in torch: the same MLP, data, rounds and variants as benchmarks/w4.py.

Its ClientApp module imports torch, as a PyTorch app's does, so every worker loads
torch before its first task; torch sizes its intra-op pool from ``OMP_NUM_THREADS``
as it loads.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import fedcore as fc
from benchmarks import w4

Arrays = dict[str, np.ndarray]


def _network() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, w4.HIDDEN), nn.ReLU(), nn.Linear(w4.HIDDEN, 10))


def initial_model() -> Arrays:
    torch.manual_seed(0)
    return {name: t.detach().numpy().copy() for name, t in _network().state_dict().items()}


def train(model: Arrays, partition: int, server_round: int) -> Arrays:
    """``EPOCHS`` of SGD on the node's data; the new model."""
    x, y = (torch.from_numpy(a) for a in w4.local_data(partition))
    network = _network()
    network.load_state_dict({name: torch.from_numpy(array) for name, array in model.items()})
    optimizer = torch.optim.SGD(network.parameters(), lr=w4.LR)
    generator = torch.Generator().manual_seed(partition * 1000 + server_round)
    for _ in range(w4.EPOCHS):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), w4.BATCH):
            batch = order[start : start + w4.BATCH]
            optimizer.zero_grad()
            nn.functional.cross_entropy(network(x[batch]), y[batch]).backward()
            optimizer.step()
    return {name: t.detach().numpy().copy() for name, t in network.state_dict().items()}


client = w4.client_app(train)
app = fc.App(server=w4.server_app(initial_model()), client=client)
workers = w4.workers


def run(variant: str) -> float:
    """As :func:`benchmarks.w4.run`, with the torch ClientApp."""
    return w4.run(variant, "benchmarks.w4_torch:app")


def cli(variant: str) -> None:
    """As :func:`benchmarks.w4.cli`, with the torch ClientApp."""
    w4.cli(variant, "benchmarks.w4_torch")


def floor() -> None:
    w4.serial(train, initial_model())
