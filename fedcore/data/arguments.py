"""Checks for partitioner arguments, so a typo fails when the partitioner is built.

``fedcore.strategy.arguments`` does the same job for strategies, but ``fedcore.data``
sits below every other package and imports none of them, so it keeps its own few
checks. Unlike the strategy ones they accept numpy integers and floats: partition
counts and skew parameters are often computed with numpy before they get here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


def count(name: str, value: object, *, minimum: int) -> int:
    """An int (Python or numpy, never bool) of at least ``minimum``, as a Python int."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def number_above(name: str, value: object, bound: float) -> float:
    """A finite real number strictly greater than ``bound``, as a Python float."""
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, int | float | np.integer | np.floating
    ):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > bound):
        raise ValueError(f"{name} must be a finite number > {bound:g}, got {value}")
    return float(value)


def flag(name: str, value: object) -> bool:
    """A bool; ints are refused so that ``0``/``1`` from a config file do not slip in."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def label_array(labels: ArrayLike) -> NDArray[Any]:
    """``labels`` as a 1-d numpy array of numbers, bools or strings."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-d, got an array of shape {array.shape}")
    if array.dtype.hasobject:
        # Object arrays have no stable byte form to hash, and sorting them may not be total.
        raise TypeError("labels must be numbers or strings, not Python objects")
    return array
