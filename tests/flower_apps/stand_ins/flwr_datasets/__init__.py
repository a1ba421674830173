"""A stand-in for Flower Datasets (``flwr_datasets``): partitions of the ``datasets`` stand-in.

Flower's examples build ``FederatedDataset(dataset=NAME, partitioners={"train": P})``
and ask it for ``load_partition(partition_id)``. This one loads ``NAME`` from the
``datasets`` stand-in beside it (synthetic, offline), shuffles the split with
``seed`` as Flower Datasets does by default, and hands it to the partitioner, whose
splits are fedcore's own (:mod:`fedcore.data`): the same partition id gives the same
rows in every process. Only the names the examples import are here.
"""

from __future__ import annotations

from collections.abc import Mapping

from datasets import Dataset, load_dataset

from flwr_datasets.partitioner import Partitioner

__all__ = ["FederatedDataset"]


class FederatedDataset:
    """One hub data set whose splits are cut into partitions by ``partitioners``."""

    def __init__(
        self,
        *,
        dataset: str,
        partitioners: Mapping[str, Partitioner],
        subset: str | None = None,
        shuffle: bool = True,
        seed: int | None = 42,
    ) -> None:
        self._dataset = dataset
        self._subset = subset
        self._partitioners = dict(partitioners)
        self._shuffle = shuffle
        self._seed = seed
        self._splits: dict[str, Dataset] = {}

    def load_split(self, split: str) -> Dataset:
        """The whole split, shuffled (once) unless ``shuffle`` is false."""
        if split not in self._splits:
            loaded = load_dataset(self._dataset, self._subset, split=split)
            assert isinstance(loaded, Dataset)
            self._splits[split] = loaded.shuffle(self._seed) if self._shuffle else loaded
        return self._splits[split]

    def load_partition(self, partition_id: int, split: str | None = None) -> Dataset:
        """Partition ``partition_id`` of ``split`` (which may be left out when there is
        one partitioner)."""
        if split is None:
            if len(self._partitioners) != 1:
                raise ValueError(
                    f"give the split: there are partitioners for {sorted(self._partitioners)}"
                )
            [split] = self._partitioners
        if split not in self._partitioners:
            raise ValueError(f"no partitioner for split {split!r}")
        whole = self.load_split(split)
        return whole.select(self._partitioners[split].indices(whole, partition_id))
