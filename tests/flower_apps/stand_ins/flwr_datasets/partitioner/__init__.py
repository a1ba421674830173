"""The partitioners of the ``flwr_datasets`` stand-in: fedcore's own splits.

``IidPartitioner(num_partitions)`` and ``DirichletPartitioner(num_partitions,
partition_by, alpha, min_partition_size=10, seed=42)``, with Flower Datasets'
arguments and defaults, each cutting a dataset's rows with the partitioner of the same
name in :mod:`fedcore.data`.
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset

from fedcore import data

__all__ = ["DirichletPartitioner", "IidPartitioner", "Partitioner"]


class Partitioner:
    """Picks the rows of one partition of a dataset."""

    def __init__(self, split: data.Partitioner, partition_by: str | None = None) -> None:
        self._split = split
        self._partition_by = partition_by

    @property
    def num_partitions(self) -> int:
        return self._split.num_partitions

    def indices(self, dataset: Dataset, partition_id: int) -> list[int]:
        """The positions in ``dataset`` of partition ``partition_id``'s rows."""
        if self._partition_by is None:
            labels = np.zeros(len(dataset), dtype=np.int64)
        else:
            labels = np.asarray(dataset[self._partition_by])
        return self._split.partition(labels, partition_id).tolist()


class IidPartitioner(Partitioner):
    """Near-equal random parts."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__(data.IidPartitioner(num_partitions))


class DirichletPartitioner(Partitioner):
    """Each value of column ``partition_by`` shared out by Dirichlet(``alpha``) proportions."""

    def __init__(
        self,
        num_partitions: int,
        partition_by: str,
        alpha: float,
        min_partition_size: int = 10,
        seed: int | None = 42,
    ) -> None:
        split = data.DirichletPartitioner(
            num_partitions, alpha=alpha, seed=seed or 0, min_partition_size=min_partition_size
        )
        super().__init__(split, partition_by)
