"""Dataset helpers for simulation: split one dataset's indices among many nodes."""

from __future__ import annotations

from fedcore.data.distribution import label_distribution, label_distribution_table
from fedcore.data.label_skew import PathologicalPartitioner, ShardPartitioner
from fedcore.data.partitioners import DirichletPartitioner, IidPartitioner, Partitioner
from fedcore.data.size_skew import (
    ExponentialPartitioner,
    LinearPartitioner,
    PowerLawPartitioner,
)

__all__ = [
    "DirichletPartitioner",
    "ExponentialPartitioner",
    "IidPartitioner",
    "LinearPartitioner",
    "Partitioner",
    "PathologicalPartitioner",
    "PowerLawPartitioner",
    "ShardPartitioner",
    "label_distribution",
    "label_distribution_table",
]
