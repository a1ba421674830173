"""Checks for strategy constructor arguments, so a typo fails when the strategy is built.

A strategy is usually built in a ServerApp's ``main`` from run-config values, where a
string or a negative number slips in easily; each check names the argument and the
value it got, and returns the value normalised (ints stay ints, numbers become float).
"""

from __future__ import annotations

import math


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def fraction(name: str, value: object) -> float:
    """A number in [0, 1]."""
    number = _number(name, value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1, got {value!r}")
    return number


def count(name: str, value: object, *, minimum: int = 0) -> int:
    """An int of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def positive(name: str, value: object) -> float:
    """A finite number > 0."""
    number = _number(name, value)
    if not number > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return number


def non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    number = _number(name, value)
    if not number >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return number


def in_range(name: str, value: object, low: float, high: float) -> float:
    """A number in the half-open interval [low, high)."""
    number = _number(name, value)
    if not low <= number < high:
        raise ValueError(f"{name} must be in [{low:g}, {high:g}), got {value!r}")
    return number


def flag(name: str, value: object) -> bool:
    """A bool (a string such as ``"false"`` from a run config is refused, not read as true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value
