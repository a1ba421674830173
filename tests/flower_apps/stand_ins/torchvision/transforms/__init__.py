"""``Compose``, ``ToTensor``, ``Normalize``, ``RandomCrop``, ``RandomHorizontalFlip``
and :mod:`~torchvision.transforms.functional`'s ``to_tensor``.

They do what torchvision's documentation says of them, for the inputs the examples
give them: PIL images (``RGB`` or ``L``) from the ``datasets`` stand-in, then the
tensor ``ToTensor`` makes of one. The random ones draw from torch's generator, as
torchvision's do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from torchvision.transforms import functional

__all__ = [
    "Compose",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "ToTensor",
    "functional",
]


class Compose:
    """Each transform in turn."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image


class ToTensor:
    """A PIL image or an ``H×W(×C)`` uint8 array -> a float32 ``C×H×W`` tensor in [0, 1]."""

    def __call__(self, image: Image.Image | np.ndarray) -> torch.Tensor:
        return functional.to_tensor(image)


class Normalize:
    """``(tensor - mean) / std``, channel by channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = list(mean)
        self.std = list(std)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std


class RandomCrop:
    """A ``size`` crop at a random place, after padding each side with ``padding`` zeros."""

    def __init__(self, size: int | Sequence[int], padding: int = 0) -> None:
        self.size = (size, size) if isinstance(size, int) else (size[0], size[1])
        self.padding = padding

    def __call__(self, image: Image.Image) -> Image.Image:
        pixels = np.asarray(image)
        pad = [(self.padding, self.padding)] * 2 + [(0, 0)] * (pixels.ndim - 2)
        pixels = np.pad(pixels, pad)
        height, width = self.size
        top = int(torch.randint(0, pixels.shape[0] - height + 1, (1,)))
        left = int(torch.randint(0, pixels.shape[1] - width + 1, (1,)))
        return Image.fromarray(pixels[top : top + height, left : left + width])


class RandomHorizontalFlip:
    """The image mirrored left to right, with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image: Image.Image) -> Image.Image:
        if float(torch.rand(1)) < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image
