"""Dataset helpers for simulation: split one dataset's indices among many nodes."""

from __future__ import annotations

from fedcore.data.partitioners import (
    DirichletPartitioner,
    IidPartitioner,
    Partitioner,
    label_distribution,
)

__all__ = [
    "DirichletPartitioner",
    "IidPartitioner",
    "Partitioner",
    "label_distribution",
]
