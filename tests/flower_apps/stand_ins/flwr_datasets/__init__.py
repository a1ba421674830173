"""A stand-in for Flower Datasets (``flwr_datasets``): partitions of the ``datasets`` stand-in.

Flower's examples build ``FederatedDataset(dataset=NAME, partitioners={"train": P})``
and ask it for ``load_partition(partition_id)``. This one loads ``NAME`` from the
``datasets`` stand-in beside it (synthetic, offline), shuffles each split with
``seed`` as Flower Datasets does by default, passes the splits through the
``preprocessor`` when there is one, and hands a split to its partitioner, whose
splits are fedcore's own (:mod:`fedcore.data`): the same partition id gives the same
rows (or columns) in every process. Only the names the examples import are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from datasets import Dataset, DatasetDict, load_dataset

from flwr_datasets.partitioner import Partitioner

__all__ = ["FederatedDataset"]

Preprocessor = Callable[[DatasetDict], DatasetDict]


class FederatedDataset:
    """One hub data set whose splits are cut into partitions by ``partitioners``."""

    def __init__(
        self,
        *,
        dataset: str,
        partitioners: Mapping[str, Partitioner],
        subset: str | None = None,
        preprocessor: Preprocessor | None = None,
        shuffle: bool = True,
        seed: int | None = 42,
    ) -> None:
        self._dataset = dataset
        self._subset = subset
        self._partitioners = dict(partitioners)
        self._preprocessor = preprocessor
        self._shuffle = shuffle
        self._seed = seed
        self._splits: DatasetDict | None = None

    def load_split(self, split: str) -> Dataset:
        """The whole split: shuffled unless ``shuffle`` is false, then preprocessed (the
        splits are prepared once, all together, as the preprocessor may move rows
        between them)."""
        if self._splits is None:
            loaded = load_dataset(self._dataset, self._subset)
            assert isinstance(loaded, DatasetDict)
            if self._shuffle:
                loaded = DatasetDict({name: s.shuffle(self._seed) for name, s in loaded.items()})
            self._splits = loaded if self._preprocessor is None else self._preprocessor(loaded)
        if split not in self._splits:
            raise ValueError(f"{self._dataset} has no split {split!r}; it has {list(self._splits)}")
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
        return self._partitioners[split].partition(self.load_split(split), partition_id)
