"""Aggregation math as pure numpy: no Grid, no event loop, no messages.

Means are running: :class:`ArrayMean` and :class:`MetricMean` take one record at a
time, so a strategy can fold each reply in as it arrives and let its buffers go —
memory O(model), not O(model × cohort).

Sums are taken in float64 (complex128 for complex arrays) and cast back to each
array's dtype, so the average of float16 or float32 models does not lose precision
to rounding in the running sum. Integer arrays (counters such as a batch-norm
``num_batches_tracked``) are rounded to the nearest integer, booleans by majority.
The order of the inputs fixes the result bit for bit; callers pass them in a
deterministic order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord, MetricRecord
from fedcore.domain.records import NDArray


def _accumulator_dtype(dtype: np.dtype[Any]) -> type[np.generic]:
    return np.complex128 if dtype.kind == "c" else np.float64


def _cast_back(total: NDArray, dtype: np.dtype[Any]) -> NDArray:
    if dtype.kind == "b":
        return total >= 0.5
    if dtype.kind in "iu":
        return np.rint(total).astype(dtype)
    return total.astype(dtype)


def check_same_layout(expected: ArrayRecord, record: ArrayRecord) -> None:
    """Raise ``ValueError`` unless ``record`` has ``expected``'s keys, shapes and dtypes."""
    if list(record) != list(expected):
        raise ValueError(f"arrays {list(record)} do not match {list(expected)}")
    for key, array in record.items():
        reference = expected[key]
        if array.shape != reference.shape or array.dtype != reference.dtype:
            raise ValueError(
                f"array {key!r} is {array.dtype}{list(array.shape)}, "
                f"expected {reference.dtype}{list(reference.shape)}"
            )


_CHUNK = 1 << 15
"""Elements folded per step: small enough that the scaled chunk stays in the CPU cache."""


def _fold(total: NDArray, array: NDArray, weight: float, scratch: NDArray) -> None:
    """``total += array * weight``, in one pass over ``array`` and no temporary array.

    A weight of one is a cast-and-add; any other goes through ``scratch`` a chunk at
    a time, so that the scaled values are still in cache when they are added.
    """
    flat_total, flat = total.reshape(-1), array.reshape(-1)
    if weight == 1:
        np.add(flat_total, flat, out=flat_total)
        return
    factor = np.float64(weight)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start : start + _CHUNK]
        scaled = scratch[: part.size]
        np.multiply(part, factor, out=scaled)
        np.add(flat_total[start : start + _CHUNK], scaled, out=flat_total[start : start + _CHUNK])


class ArrayMean:
    """The weighted mean of ArrayRecords, one record at a time.

    The first record fixes the layout (keys, shapes, dtypes); :meth:`add` refuses a
    record that differs with ``ValueError`` and leaves the mean as it was.
    """

    def __init__(self) -> None:
        self._layout: ArrayRecord | None = None
        self._sums: dict[str, NDArray] = {}
        self._scratch: dict[str, NDArray] = {}
        self._weight = 0.0

    def add(self, arrays: ArrayRecord, weight: float) -> None:
        if not weight >= 0:
            raise ValueError(f"weights must be non-negative, got {weight}")
        if self._layout is None:
            self._layout = arrays
            self._sums = {
                key: np.zeros(array.shape, dtype=_accumulator_dtype(array.dtype))
                for key, array in arrays.items()
            }
            self._scratch = {
                key: np.empty(min(total.size, _CHUNK), dtype=total.dtype)
                for key, total in self._sums.items()
            }
        else:
            check_same_layout(self._layout, arrays)
        self._weight += weight
        if weight == 0:
            return
        for key, array in arrays.items():
            _fold(self._sums[key], array, weight, self._scratch[key])

    @property
    def weight(self) -> float:
        """The total weight added so far."""
        return self._weight

    def result(self) -> ArrayRecord:
        """The mean so far; ``ValueError`` if nothing with a positive weight was added."""
        if self._layout is None or not self._weight > 0:
            raise ValueError("no arrays with a positive weight to average")
        return ArrayRecord(
            {
                key: _cast_back(total / self._weight, self._layout[key].dtype)
                for key, total in self._sums.items()
            }
        )


class MetricMean:
    """The weighted mean of every metric (lists element by element), except ``exclude``.

    A metric missing from some records is averaged over the records that have it,
    with their weights renormalised.
    """

    def __init__(self, *, exclude: str = "") -> None:
        self._exclude = exclude
        self._sums: dict[str, Any] = {}
        self._mass: dict[str, float] = {}

    def add(self, record: MetricRecord, weight: float) -> None:
        for key, value in record.items():
            if key == self._exclude:
                continue
            term = np.asarray(value, dtype=np.float64) * weight
            self._sums[key] = term if key not in self._sums else self._sums[key] + term
            self._mass[key] = self._mass.get(key, 0.0) + weight

    def result(self) -> MetricRecord:
        averaged = MetricRecord()
        for key, total in self._sums.items():
            if self._mass[key] <= 0:
                continue
            mean = total / self._mass[key]
            averaged[key] = mean.tolist() if mean.ndim else float(mean)
        return averaged


def weighted_average_arrays(
    records: Sequence[ArrayRecord], weights: Sequence[float]
) -> ArrayRecord:
    """The weighted mean of ``records``; every record has the same keys and shapes.

    Raises ``ValueError`` when there is nothing to average, the weights do not sum
    to a positive number, or the records disagree on keys, shapes or dtypes.
    """
    if not records:
        raise ValueError("nothing to average")
    if len(records) != len(weights):
        raise ValueError(f"{len(records)} records but {len(weights)} weights")
    mean = ArrayMean()
    for record, weight in zip(records, weights, strict=True):
        mean.add(record, weight)
    if not mean.weight > 0:
        raise ValueError(f"weights must sum to a positive number, got {mean.weight}")
    return mean.result()


def weighted_average_metrics(
    records: Sequence[MetricRecord], weights: Sequence[float], *, exclude: str = ""
) -> MetricRecord:
    """The weighted mean of every metric in ``records``, except ``exclude``."""
    mean = MetricMean(exclude=exclude)
    for record, weight in zip(records, weights, strict=True):
        mean.add(record, weight)
    return mean.result()
