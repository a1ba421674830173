"""Rows of named columns, read as the examples read a Hugging Face ``Dataset``.

What the examples do with one: ``len(ds)``; ``ds[i]`` for a row (a dict, which a
torch ``DataLoader`` collates); ``ds[:]`` under ``with_format("pandas")`` for a
DataFrame; ``train_test_split(test_size=, seed=)``; ``with_transform(fn)``, where
``fn`` gets a batch (a dict of lists) and returns it changed, and a row is the batch
of one it returns; ``with_format("torch")``. Columns are numpy arrays; an image
column's rows come out as PIL images, as the hub's image columns do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

Batch = dict[str, list[Any]]
Transform = Callable[[Batch], Batch]

FORMATS = (None, "torch", "pandas")


class Dataset:
    """Columns of equal length (numpy arrays), some of them images, seen through a
    selection of row indices, a format and a transform (each call returns a new view)."""

    def __init__(
        self,
        columns: Mapping[str, np.ndarray],
        *,
        images: Iterable[str] = (),
        indices: np.ndarray | None = None,
        format_type: str | None = None,
        transform: Transform | None = None,
    ) -> None:
        lengths = {len(column) for column in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._columns = dict(columns)
        self._images = frozenset(images)
        self._indices = np.arange(lengths.pop()) if indices is None else indices
        self._format = format_type
        self._transform = transform

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            return self._values(key, self._indices)
        if isinstance(key, slice):
            return self._formatted(self._indices[key])
        row = self._formatted(self._indices[[key]])
        if self._format == "pandas":
            return row
        return {name: values[0] for name, values in row.items()}

    def select(self, indices: Iterable[int]) -> Dataset:
        """The rows at ``indices`` (positions in this view), in that order."""
        return self._view(indices=self._indices[np.asarray(list(indices), dtype=np.int64)])

    def shuffle(self, seed: int | None = None) -> Dataset:
        order = np.random.default_rng(seed).permutation(len(self))
        return self._view(indices=self._indices[order])

    def train_test_split(
        self, test_size: float | int, *, seed: int | None = None, shuffle: bool = True
    ) -> DatasetDict:
        """``{"train", "test"}``: ``test_size`` rows (a fraction of them, rounded up) for
        test, the others for train, after a shuffle seeded by ``seed``."""
        n = len(self)
        tests = math.ceil(test_size * n) if isinstance(test_size, float) else int(test_size)
        if not 0 < tests < n:
            raise ValueError(f"test_size={test_size!r} leaves no train or no test rows of {n}")
        order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
        return DatasetDict(
            {
                "train": self._view(indices=self._indices[np.sort(order[tests:])]),
                "test": self._view(indices=self._indices[np.sort(order[:tests])]),
            }
        )

    def with_format(self, type: str | None = None) -> Dataset:
        """Rows as torch tensors (``"torch"``), a DataFrame (``"pandas"``) or Python
        values (``None``); like Hugging Face's, it replaces a transform."""
        if type not in FORMATS:
            raise NotImplementedError(f"the datasets stand-in has no format {type!r}")
        return self._view(format_type=type, transform=None)

    def with_transform(self, transform: Transform) -> Dataset:
        """Rows passed through ``transform`` as batches; like Hugging Face's, it replaces
        a format."""
        return self._view(format_type=None, transform=transform)

    def _view(self, **changes: Any) -> Dataset:
        settings: dict[str, Any] = {
            "images": self._images,
            "indices": self._indices,
            "format_type": self._format,
            "transform": self._transform,
            **changes,
        }
        return Dataset(self._columns, **settings)

    def _values(self, name: str, rows: np.ndarray) -> list[Any]:
        """Column ``name`` at ``rows`` as Python objects: images as PIL images."""
        values = self._columns[name][rows]
        if name in self._images:
            from PIL import Image

            return [Image.fromarray(value) for value in values]
        return values.tolist()

    def _formatted(self, rows: np.ndarray) -> Any:
        if self._format == "pandas":
            import pandas as pd

            return pd.DataFrame({name: column[rows] for name, column in self._columns.items()})
        if self._format == "torch":
            import torch

            return {
                name: [torch.as_tensor(column[row]) for row in rows]
                for name, column in self._columns.items()
            }
        batch = {name: self._values(name, rows) for name in self._columns}
        return batch if self._transform is None else self._transform(batch)


class DatasetDict(dict[str, Dataset]):
    """Named splits (``"train"``, ``"test"``); ``with_transform`` applies to each."""

    def with_transform(self, transform: Transform) -> DatasetDict:
        return DatasetDict({name: split.with_transform(transform) for name, split in self.items()})

    def with_format(self, type: str | None = None) -> DatasetDict:
        return DatasetDict({name: split.with_format(type) for name, split in self.items()})
