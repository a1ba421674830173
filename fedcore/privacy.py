"""Differential-privacy math on ArrayRecords: update norms, clipping, Gaussian noise.

Central DP with fixed clipping (McMahan et al., 2018; Geyer et al., 2017) bounds how
far one node can move the aggregate: each node's *update* (the arrays it replied with
minus those it was sent) is scaled to an L2 norm of at most ``clipping_norm`` C, the
norm taken over every element of every array as one flat vector, and Gaussian noise of
standard deviation ``noise_multiplier × C / m`` is added to the mean of the m clipped
updates (:func:`noise_std`). Pure numpy and no state, so that the DP strategies and
mods share one implementation and a test can call it with hand-made records.

Arithmetic is in float64, each result cast back to its array's dtype: integer arrays
are rounded and booleans thresholded at one half, so for them the bound holds only up
to that rounding. Complex arrays are refused (``TypeError``): real noise would protect
only their real parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord
from fedcore.domain.array import NDArray

CLIPPING_NORM_KEY = "clipping_norm"
"""The train-config key under which a server sends nodes the clipping norm (Flower's key)."""

NORM_BIT_KEY = "norm_bit"
"""The reply metric by which a node tells adaptive clipping whether it clipped its
update: 1 if it did, 0 if not (Flower's key and meaning)."""


@dataclass(frozen=True)
class Clipped:
    """The outcome of :func:`clip_update`."""

    arrays: ArrayRecord
    """The reply's arrays with the update clipped: ``sent + scale × (reply − sent)``."""
    norm: float
    """The L2 norm of the update before clipping."""
    scale: float
    """The factor the update was multiplied by: ``min(1, clipping_norm / norm)``."""

    @property
    def clipped(self) -> bool:
        """Whether the update was longer than the clipping norm and so was scaled down."""
        return self.scale < 1.0


def noise_std(noise_multiplier: float, clipping_norm: float, num_sampled_clients: int) -> float:
    """The standard deviation of the noise on a mean of ``num_sampled_clients`` updates,
    each at most ``clipping_norm`` long: ``noise_multiplier × clipping_norm / m``."""
    return noise_multiplier * clipping_norm / num_sampled_clients


def update_norm(reply: ArrayRecord, sent: ArrayRecord) -> float:
    """The L2 norm of ``reply − sent`` across all arrays, one array in float64 at a time.

    ``ValueError`` if the two records differ in keys or shapes.
    """
    if set(reply) != set(sent):
        raise ValueError(f"the reply has arrays {list(reply)}, but {list(sent)} were sent")
    total = 0.0
    for key, array in reply.items():
        difference = _difference(key, array, sent)
        total += float(np.dot(difference.reshape(-1), difference.reshape(-1)))
    return math.sqrt(total)


def clip_update(reply: ArrayRecord, sent: ArrayRecord, clipping_norm: float) -> Clipped:
    """``reply`` with its update relative to ``sent`` scaled to at most ``clipping_norm``.

    An update already within the norm leaves ``reply`` as it is (the same record,
    not a copy). ``ValueError`` for a clipping norm that is not positive, records
    that differ in keys or shapes, or an update with a NaN or infinite entry, which
    no scaling could bound.
    """
    if not clipping_norm > 0:
        raise ValueError(f"clipping_norm must be > 0, got {clipping_norm!r}")
    norm = update_norm(reply, sent)
    if not math.isfinite(norm):
        raise ValueError(f"the update has non-finite entries (norm {norm}); it cannot be clipped")
    if norm <= clipping_norm:
        return Clipped(reply, norm, 1.0)
    scale = clipping_norm / norm
    arrays = ArrayRecord()
    for key, array in reply.items():
        base = sent[key].astype(np.float64)
        arrays[key] = _cast(base + _difference(key, array, sent) * scale, array.dtype)
    return Clipped(arrays, norm, scale)


def add_gaussian_noise(arrays: ArrayRecord, std: float, rng: np.random.Generator) -> ArrayRecord:
    """``arrays`` plus independent N(0, std²) noise on every element, drawn from ``rng``
    array by array in key order (so a seeded ``rng`` gives the same noise every time).

    A ``std`` of zero returns the arrays themselves, in a new record, and draws nothing.
    """
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"the noise std must be a finite number >= 0, got {std!r}")
    noisy = ArrayRecord()
    for key, array in arrays.items():
        _check_real(key, array)
        if std == 0:
            noisy[key] = array
            continue
        noise = rng.normal(0.0, std, size=array.shape)
        noisy[key] = _cast(array.astype(np.float64) + noise, array.dtype)
    return noisy


def _difference(key: str, array: NDArray, sent: ArrayRecord) -> NDArray:
    """``array − sent[key]`` in float64, checking that the shapes match."""
    base = sent[key]
    if array.shape != base.shape:
        raise ValueError(
            f"array {key!r} has shape {list(array.shape)}, but was sent as {list(base.shape)}"
        )
    _check_real(key, array)
    _check_real(key, base)
    difference: NDArray = array.astype(np.float64) - base
    return difference


def _check_real(key: str, array: NDArray) -> None:
    if array.dtype.kind == "c":
        raise TypeError(
            f"array {key!r} is complex ({array.dtype}); differential privacy here needs real arrays"
        )


def _cast(values: NDArray, dtype: np.dtype[Any]) -> NDArray:
    """float64 ``values`` back to an array of ``dtype``: integers rounded and saturated,
    booleans thresholded at one half. Arithmetic on a 0-d array gives a numpy scalar;
    it goes back to being a 0-d array here."""
    values = np.asarray(values)
    if dtype.kind == "b":
        return np.asarray(values >= 0.5)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.asarray(np.clip(np.rint(values), info.min, info.max).astype(dtype))
    return np.asarray(values.astype(dtype))
