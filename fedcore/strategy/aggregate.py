"""Aggregation math as pure numpy functions: no Grid, no event loop, no messages.

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


def weighted_average_arrays(
    records: Sequence[ArrayRecord], weights: Sequence[float]
) -> ArrayRecord:
    """The weighted mean of ``records``, key by key; every record has the same keys and shapes.

    Raises ``ValueError`` when there is nothing to average, the weights do not sum
    to a positive number, or the records disagree on keys, shapes or dtypes.
    """
    if not records:
        raise ValueError("nothing to average")
    if len(records) != len(weights):
        raise ValueError(f"{len(records)} records but {len(weights)} weights")
    total_weight = float(sum(weights))
    if not total_weight > 0:
        raise ValueError(f"weights must sum to a positive number, got {total_weight}")
    first = records[0]
    for record in records[1:]:
        check_same_layout(first, record)
    averaged = ArrayRecord()
    for key, template in first.items():
        total = np.zeros(template.shape, dtype=_accumulator_dtype(template.dtype))
        for record, weight in zip(records, weights, strict=True):
            total += record[key] * np.float64(weight / total_weight)
        averaged[key] = _cast_back(total, template.dtype)
    return averaged


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


def weighted_average_metrics(
    records: Sequence[MetricRecord], weights: Sequence[float], *, exclude: str = ""
) -> MetricRecord:
    """The weighted mean of every metric (lists element by element), except ``exclude``.

    A metric missing from some records is averaged over the records that have it,
    with their weights renormalised.
    """
    sums: dict[str, Any] = {}
    mass: dict[str, float] = {}
    for record, weight in zip(records, weights, strict=True):
        for key, value in record.items():
            if key == exclude:
                continue
            term = np.asarray(value, dtype=np.float64) * weight
            sums[key] = term if key not in sums else sums[key] + term
            mass[key] = mass.get(key, 0.0) + weight
    averaged = MetricRecord()
    for key, total in sums.items():
        if mass[key] <= 0:
            continue
        mean = total / mass[key]
        averaged[key] = mean.tolist() if mean.ndim else float(mean)
    return averaged
