"""``to_tensor``: the function :class:`~torchvision.transforms.ToTensor` calls, which
e2e-pytorch-lightning calls itself (as ``transforms.functional.to_tensor``)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

__all__ = ["to_tensor"]


def to_tensor(pic: Image.Image | np.ndarray) -> torch.Tensor:
    """A PIL image or an ``H×W(×C)`` uint8 array -> a float32 ``C×H×W`` tensor in [0, 1]."""
    pixels = np.asarray(pic)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    # A copy: a PIL image's pixels are read-only, and the tensor is the model's input.
    tensor = torch.from_numpy(pixels.transpose(2, 0, 1).copy())
    if tensor.dtype == torch.uint8:
        return tensor.to(torch.float32).div(255)
    return tensor
