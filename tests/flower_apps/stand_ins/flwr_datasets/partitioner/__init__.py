"""The partitioners of the ``flwr_datasets`` stand-in: fedcore's own splits.

With Flower Datasets' arguments and defaults, each cutting a dataset's rows with the
partitioner of the same name in :mod:`fedcore.data`:

- ``IidPartitioner(num_partitions)``: near-equal random parts;
- ``DirichletPartitioner(num_partitions, partition_by, alpha, min_partition_size=10,
  seed=42)``: label skew;
- ``LinearPartitioner``, ``SquarePartitioner``, ``ExponentialPartitioner``
  ``(num_partitions)``: quantity skew, partition i's share growing as ``i + 1``,
  ``(i + 1) ** 2``, ``e ** (i + 1)`` (the square law is fedcore's size-skew split with
  that law, which :mod:`fedcore.data` does not offer by itself);

and one that cuts columns, not rows: ``VerticalSizePartitioner(partition_sizes,
active_party_columns=None, active_party_columns_mode="add_to_last", drop_columns=None,
shared_columns=None, shuffle=True, seed=42)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import numpy as np
from datasets import Dataset
from numpy.typing import NDArray

from fedcore import data
from fedcore.data.size_skew import SizeSkewPartitioner

__all__ = [
    "DirichletPartitioner",
    "ExponentialPartitioner",
    "IidPartitioner",
    "LinearPartitioner",
    "Partitioner",
    "SquarePartitioner",
    "VerticalSizePartitioner",
]


class Partitioner(ABC):
    """Cuts one partition out of a dataset."""

    @property
    @abstractmethod
    def num_partitions(self) -> int: ...

    @abstractmethod
    def partition(self, dataset: Dataset, partition_id: int) -> Dataset:
        """Partition ``partition_id`` of ``dataset``."""


class _Rows(Partitioner):
    """Picks the rows of a partition with one of fedcore's splits, of the rows' values of
    column ``partition_by`` where the split needs labels."""

    def __init__(self, split: data.Partitioner, partition_by: str | None = None) -> None:
        self._split = split
        self._partition_by = partition_by

    @property
    def num_partitions(self) -> int:
        return self._split.num_partitions

    def partition(self, dataset: Dataset, partition_id: int) -> Dataset:
        if self._partition_by is None:
            labels = np.zeros(len(dataset), dtype=np.int64)
        else:
            labels = np.asarray(dataset[self._partition_by])
        return dataset.select(self._split.partition(labels, partition_id).tolist())


class IidPartitioner(_Rows):
    """Near-equal random parts."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__(data.IidPartitioner(num_partitions))


class DirichletPartitioner(_Rows):
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


class LinearPartitioner(_Rows):
    """Partition i's share grows as ``i + 1``."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__(data.LinearPartitioner(num_partitions))


class _SquareLaw(SizeSkewPartitioner):
    """fedcore's size-skew split with shares ∝ ``(i + 1) ** 2``."""

    def _params(self) -> dict[str, object]:
        return {"num_partitions": self._num_partitions, "seed": self._seed}

    def _weights(self) -> NDArray[np.float64]:
        return (np.arange(1, self._num_partitions + 1) / self._num_partitions) ** 2


class SquarePartitioner(_Rows):
    """Partition i's share grows as ``(i + 1) ** 2``."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__(_SquareLaw(num_partitions))


class ExponentialPartitioner(_Rows):
    """Partition i's share grows as ``e ** (i + 1)``."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__(data.ExponentialPartitioner(num_partitions))


ActivePartyMode = (
    Literal["add_to_first", "add_to_last", "create_as_first", "create_as_last", "add_to_all"] | int
)


class VerticalSizePartitioner(Partitioner):
    """Cuts a dataset's columns, not its rows: partition i gets ``partition_sizes[i]``
    of them (every row). The columns to share out are those not dropped, shared or of
    the active party, in an order shuffled by ``seed``; the active party's columns
    (a vertical federation's labels) are then placed by ``active_party_columns_mode``
    (added to the first, last or every partition, or to partition N, or made a
    partition of their own, first or last), and the shared columns added to every
    partition."""

    def __init__(
        self,
        partition_sizes: list[int],
        active_party_columns: str | list[str] | None = None,
        active_party_columns_mode: ActivePartyMode = "add_to_last",
        drop_columns: str | list[str] | None = None,
        shared_columns: str | list[str] | None = None,
        shuffle: bool = True,
        seed: int | None = 42,
    ) -> None:
        if not all(isinstance(size, int) and size >= 0 for size in partition_sizes):
            raise ValueError("the flwr_datasets stand-in takes column counts (ints >= 0) only")
        self._sizes = list(partition_sizes)
        self._active = _names(active_party_columns)
        self._mode = active_party_columns_mode
        self._dropped = _names(drop_columns)
        self._shared = _names(shared_columns)
        self._shuffle = shuffle
        self._seed = seed

    @property
    def num_partitions(self) -> int:
        created = isinstance(self._mode, str) and self._mode.startswith("create_as_")
        return len(self._sizes) + (1 if created and self._active else 0)

    def partition(self, dataset: Dataset, partition_id: int) -> Dataset:
        """All rows of ``dataset``, only partition ``partition_id``'s columns."""
        parts = self.columns(dataset.column_names)
        if not 0 <= partition_id < len(parts):
            raise IndexError(f"partition_id {partition_id} is not in [0, {len(parts)})")
        return dataset.select_columns(parts[partition_id])

    def columns(self, column_names: list[str]) -> list[list[str]]:
        """Each partition's columns, for a dataset of ``column_names``."""
        unknown = [name for name in self._active + self._shared if name not in column_names]
        if unknown:
            raise ValueError(f"columns {unknown} are not in {column_names}")
        set_aside = set(self._dropped + self._shared + self._active)
        columns = [name for name in column_names if name not in set_aside]
        if sum(self._sizes) != len(columns):
            raise ValueError(f"partition sizes {self._sizes} do not add up to {len(columns)}")
        if self._shuffle:
            np.random.default_rng(self._seed).shuffle(columns)
        ends = np.cumsum(self._sizes).tolist()
        parts = [columns[end - size : end] for size, end in zip(self._sizes, ends, strict=True)]
        parts = self._place_active_party(parts)
        return [part + self._shared for part in parts]

    def _place_active_party(self, parts: list[list[str]]) -> list[list[str]]:
        if not self._active:
            return parts
        match self._mode:
            case "create_as_first":
                return [list(self._active), *parts]
            case "create_as_last":
                return [*parts, list(self._active)]
            case "add_to_first":
                return [parts[0] + self._active, *parts[1:]]
            case "add_to_last":
                return [*parts[:-1], parts[-1] + self._active]
            case "add_to_all":
                return [part + self._active for part in parts]
            case int(index) if 0 <= index < len(parts):
                return [part + self._active if i == index else part for i, part in enumerate(parts)]
        raise ValueError(f"active_party_columns_mode {self._mode!r} is not one Flower offers")


def _names(columns: str | list[str] | None) -> list[str]:
    if columns is None:
        return []
    return [columns] if isinstance(columns, str) else list(columns)
