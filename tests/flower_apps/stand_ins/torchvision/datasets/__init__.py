"""``torchvision.datasets.CIFAR10``: synthetic CIFAR-10 images, made on demand, offline.

(``MNIST``, real digits for Flower's baselines, is in :mod:`torchvision.datasets.mnist`.)

Flower's e2e apps e2e-pytorch and e2e-opacus load CIFAR-10 with torchvision, which
downloads it. This stand-in has the real sets' lengths (50,000 train and 10,000 test
images), so the apps' own arithmetic on ``len(data)`` cuts the subsets it means to,
and makes an image only when it is read: image ``i`` of a split is a per-class
pattern plus noise, drawn from a generator seeded by the split and ``i``, so every
process reads the same image at the same index and a model can learn the classes.
``root`` and ``download`` are accepted and nothing is written.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from torchvision.datasets.mnist import MNIST, FashionMNIST

__all__ = ["CIFAR10", "MNIST", "FashionMNIST"]

SHAPE = (32, 32, 3)
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _seed(part: str) -> int:
    return zlib.crc32(f"torchvision/cifar10:{part}".encode())


_PATTERNS = np.random.default_rng(_seed("patterns")).integers(0, 256, (len(CLASSES), *SHAPE))


class CIFAR10:
    """``(image, label)`` pairs: a 32×32 RGB PIL image (through ``transform``) and its
    class index (through ``target_transform``), as torchvision's ``CIFAR10`` gives them."""

    def __init__(
        self,
        root: Any,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        self.root = root
        self.classes = list(CLASSES)
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        self._seed = _seed("train" if train else "test")
        self._length = 50_000 if train else 10_000

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not -self._length <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} images")
        rng = np.random.default_rng([self._seed, index % self._length])
        label = int(rng.integers(len(CLASSES)))
        noise = rng.integers(0, 256, SHAPE)
        image: Any = Image.fromarray((0.6 * _PATTERNS[label] + 0.4 * noise).astype(np.uint8))
        target: Any = label
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
