"""``load_dataset(name)``: small synthetic data sets under the hub names the examples use.

Each has the columns, dtypes and image shapes of the hub's data set of that name, and
far fewer rows, so an example trains in seconds. Its values are drawn from a
generator seeded by the name and split, so every process — the engine, each worker,
each node's ClientApp — builds the same rows, and a partition id always means the
same data. The images are learnable: each is a per-class pattern plus noise.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datasets.dataset import Dataset, DatasetDict

IRIS_SPECIES = ("Iris-setosa", "Iris-versicolor", "Iris-virginica")
# Per species: the mean and spread of sepal length, sepal width, petal length, petal
# width (cm), roughly those of Fisher's iris measurements.
IRIS_MEANS = ((5.0, 3.4, 1.5, 0.2), (5.9, 2.8, 4.3, 1.3), (6.6, 3.0, 5.6, 2.0))
IRIS_SPREADS = ((0.35, 0.38, 0.17, 0.1), (0.52, 0.31, 0.47, 0.2), (0.64, 0.32, 0.55, 0.27))
IRIS_ROWS = 50  # per species, as in the original


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


def _iris(name: str, split: str) -> Dataset:
    rng = _generator(name, split)
    species = np.repeat(np.arange(len(IRIS_SPECIES)), IRIS_ROWS)
    means, spreads = np.array(IRIS_MEANS)[species], np.array(IRIS_SPREADS)[species]
    # One decimal, as measured; kept within (0, 10) cm, where every histogram of the
    # examples has its bins.
    sizes = np.clip(np.round(rng.normal(means, spreads), 1), 0.1, 9.9)
    columns = ("SepalLengthCm", "SepalWidthCm", "PetalLengthCm", "PetalWidthCm")
    return Dataset(
        {
            "Id": np.arange(1, len(species) + 1),
            **{column: sizes[:, i] for i, column in enumerate(columns)},
            "Species": np.array(IRIS_SPECIES)[species],
        }
    )


_CIFAR10 = _Images("img", (32, 32, 3), {"train": 240, "test": 60})
_FASHION_MNIST = _Images("image", (28, 28), {"train": 240, "test": 60})

CATALOG: dict[str, tuple[tuple[str, ...], Callable[[str, str], Dataset]]] = {
    "uoft-cs/cifar10": (("train", "test"), _CIFAR10.split),
    "zalando-datasets/fashion_mnist": (("train", "test"), _FASHION_MNIST.split),
    "scikit-learn/iris": (("train",), _iris),
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
