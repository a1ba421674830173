"""Rows of named columns, read as the examples read a Hugging Face ``Dataset``.

What the examples do with one: ``len(ds)``, ``ds.num_rows``, ``ds.shape``; ``ds[i]``
for a row (a dict, which a torch ``DataLoader`` collates); ``ds[:]`` under
``with_format("pandas")`` for a DataFrame, under ``set_format("numpy")`` (in place, as
Hugging Face's) for a dict of arrays; ``to_pandas()``; ``train_test_split(test_size= or
train_size=, seed=)``; ``select``, ``select_columns``; ``with_transform(fn)``, where ``fn`` gets a
batch (a dict of lists) and returns it changed, and a row is the batch of one it
returns; ``with_format("torch")``; ``concatenate_datasets``. Columns are numpy arrays
(a sequence column, such as HIGGS' ``inputs``, a 2-d one); an image column's rows come
out as PIL images, as the hub's image columns do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

Batch = dict[str, list[Any]]
Transform = Callable[[Batch], Batch]

FORMATS = (None, "numpy", "torch", "pandas")


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

    @property
    def num_rows(self) -> int:
        return len(self._indices)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._indices), len(self._columns))

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if self._format == "numpy":
                return self._columns[key][self._indices]
            return self._values(key, self._indices)
        if isinstance(key, slice):
            return self._formatted(self._indices[key])
        row = self._formatted(self._indices[[key]])
        if self._format == "pandas":
            return row
        return {name: values[0] for name, values in row.items()}

    def select(self, indices: Iterable[int]) -> Dataset:
        """The rows at ``indices`` (positions in this view), in that order."""
        if isinstance(indices, range):
            positions = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            positions = np.asarray(list(indices), dtype=np.int64)
        return self._view(indices=self._indices[positions])

    def select_columns(self, column_names: str | Iterable[str]) -> Dataset:
        """Only the columns ``column_names``, in that order."""
        names = [column_names] if isinstance(column_names, str) else list(column_names)
        missing = [name for name in names if name not in self._columns]
        if missing:
            raise ValueError(f"no columns {missing} in {self.column_names}")
        return Dataset(
            {name: self._columns[name] for name in names},
            images=self._images & set(names),
            indices=self._indices,
            format_type=self._format,
            transform=self._transform,
        )

    def shuffle(self, seed: int | None = None) -> Dataset:
        order = np.random.default_rng(seed).permutation(len(self))
        return self._view(indices=self._indices[order])

    def train_test_split(
        self,
        test_size: float | int | None = None,
        train_size: float | int | None = None,
        *,
        seed: int | None = None,
        shuffle: bool = True,
    ) -> DatasetDict:
        """``{"train", "test"}``: ``test_size`` rows (a fraction of them, rounded up) for
        test, or else all but ``train_size`` rows (a fraction, rounded down), or else a
        quarter, the others for train, after a shuffle seeded by ``seed``."""
        n = len(self)
        if test_size is not None:
            tests = math.ceil(test_size * n) if isinstance(test_size, float) else int(test_size)
        elif train_size is not None:
            trains = math.floor(train_size * n) if isinstance(train_size, float) else train_size
            tests = n - int(trains)
        else:  # Hugging Face's default: a quarter for test
            tests = math.ceil(0.25 * n)
        if not 0 < tests < n:
            raise ValueError(
                f"test_size={test_size!r}, train_size={train_size!r} leave no train or "
                f"no test rows of {n}"
            )
        order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
        return DatasetDict(
            {
                "train": self._view(indices=self._indices[np.sort(order[tests:])]),
                "test": self._view(indices=self._indices[np.sort(order[:tests])]),
            }
        )

    def with_format(self, type: str | None = None) -> Dataset:
        """Rows as numpy arrays (``"numpy"``), torch tensors (``"torch"``), a DataFrame
        (``"pandas"``) or Python values (``None``); like Hugging Face's, it replaces a
        transform."""
        return self._view(format_type=_format(type), transform=None)

    def set_format(self, type: str | None = None) -> None:
        """:meth:`with_format` on this dataset itself, as Hugging Face's does."""
        self._format, self._transform = _format(type), None

    def to_pandas(self) -> Any:
        """The rows as a DataFrame, whatever the format."""
        return self.with_format("pandas")[:]

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
        if self._format == "numpy":
            return {name: column[rows] for name, column in self._columns.items()}
        if self._format == "pandas":
            import pandas as pd

            # A sequence column (2-d) becomes a column of arrays, one a row.
            return pd.DataFrame(
                {
                    name: column[rows] if column.ndim == 1 else list(column[rows])
                    for name, column in self._columns.items()
                }
            )
        if self._format == "torch":
            import torch

            return {
                name: [torch.as_tensor(column[row]) for row in rows]
                for name, column in self._columns.items()
            }
        batch = {name: self._values(name, rows) for name in self._columns}
        return batch if self._transform is None else self._transform(batch)


def concatenate_datasets(dsets: Iterable[Dataset]) -> Dataset:
    """The rows of ``dsets`` one after the other, in a dataset of their own; they must
    have the same columns."""
    parts = list(dsets)
    if not parts:
        raise ValueError("no datasets to concatenate")
    names = parts[0].column_names
    if any(part.column_names != names for part in parts):
        raise ValueError(f"datasets with different columns: {[p.column_names for p in parts]}")
    return Dataset(
        {
            name: np.concatenate([part._columns[name][part._indices] for part in parts])
            for name in names
        },
        images=parts[0]._images,
    )


def _format(type: str | None) -> str | None:
    if type not in FORMATS:
        raise NotImplementedError(f"the datasets stand-in has no format {type!r}")
    return type


class DatasetDict(dict[str, Dataset]):
    """Named splits (``"train"``, ``"test"``); ``with_transform`` applies to each."""

    def with_transform(self, transform: Transform) -> DatasetDict:
        return DatasetDict({name: split.with_transform(transform) for name, split in self.items()})

    def with_format(self, type: str | None = None) -> DatasetDict:
        return DatasetDict({name: split.with_format(type) for name, split in self.items()})
