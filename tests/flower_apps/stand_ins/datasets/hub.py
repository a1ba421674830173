"""``load_dataset(name)``: small synthetic data sets under the hub names the examples use.

Each has the columns, dtypes and image shapes of the hub's data set of that name, and
far fewer rows, so an example trains in seconds. Its values are drawn from a
generator seeded by the name and split, so every process — the engine, each worker,
each node's ClientApp — builds the same rows, and a partition id always means the
same data. The images are learnable: each is a per-class pattern plus noise; the
tables (:mod:`datasets.tables`) have a target that follows their features.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datasets import tables
from datasets.dataset import Dataset, DatasetDict


@dataclass(frozen=True)
class _Images:
    """An image classification set: ``image_column`` holds uint8 images of ``shape``."""

    image_column: str
    shape: tuple[int, ...]
    rows: dict[str, int]
    classes: int = 10

    def split(self, name: str, split: str) -> Dataset:
        count = self.rows[split]
        patterns = _generator(name, "patterns").integers(0, 256, (self.classes, *self.shape))
        rng = _generator(name, split)
        labels = rng.permutation(np.arange(count) % self.classes)
        noise = rng.integers(0, 256, (count, *self.shape))
        images = (0.6 * patterns[labels] + 0.4 * noise).astype(np.uint8)
        return Dataset(
            {self.image_column: images, "label": labels.astype(np.int64)},
            images=[self.image_column],
        )


@dataclass(frozen=True)
class _Table:
    """A tabular set: ``build`` makes ``rows[split]`` rows of a split (:mod:`datasets.tables`)."""

    build: Callable[[np.random.Generator, int], Dataset]
    rows: dict[str, int]

    def split(self, name: str, split: str) -> Dataset:
        return self.build(_generator(name, split), self.rows[split])


_CIFAR10 = _Images("img", (32, 32, 3), {"train": 240, "test": 60})
_FASHION_MNIST = _Images("image", (28, 28), {"train": 240, "test": 60})
_MNIST = _Images("image", (28, 28), {"train": 2000, "test": 200})

_IRIS = _Table(tables.iris, {"train": 150})
# Far fewer rows than the hub's 10.5 million, but more than 500,000 in train:
# xgboost-comprehensive's preprocessor moves the last 500,000 rows of train to test.
_HIGGS = _Table(tables.higgs, {"train": 504_000, "test": 1_000})
_ADULT = _Table(tables.adult_census_income, {"train": 2_000})
_TITANIC = _Table(tables.titanic_survival, {"train": 887})  # all of the hub's rows

CATALOG: dict[str, tuple[tuple[str, ...], Callable[[str, str], Dataset]]] = {
    "uoft-cs/cifar10": (("train", "test"), _CIFAR10.split),
    "zalando-datasets/fashion_mnist": (("train", "test"), _FASHION_MNIST.split),
    "ylecun/mnist": (("train", "test"), _MNIST.split),
    "scikit-learn/iris": (tuple(_IRIS.rows), _IRIS.split),
    "jxie/higgs": (tuple(_HIGGS.rows), _HIGGS.split),
    "scikit-learn/adult-census-income": (tuple(_ADULT.rows), _ADULT.split),
    "julien-c/titanic-survival": (tuple(_TITANIC.rows), _TITANIC.split),
}
"""Hub name -> its splits and what builds one."""


def load_dataset(
    path: str, name: str | None = None, *, split: str | None = None
) -> Dataset | DatasetDict:
    """The split ``split`` of data set ``path``, or all its splits when ``split`` is None."""
    if path not in CATALOG or name is not None:
        raise FileNotFoundError(
            f"the datasets stand-in has no data set {path!r}"
            + (f" (configuration {name!r})" if name is not None else "")
            + f"; it has {', '.join(sorted(CATALOG))}"
        )
    splits, build = CATALOG[path]
    if split is None:
        return DatasetDict({each: build(path, each) for each in splits})
    if split not in splits:
        raise ValueError(f"{path} has no split {split!r}; it has {', '.join(splits)}")
    return build(path, split)


def _generator(name: str, part: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{name}:{part}".encode()))
