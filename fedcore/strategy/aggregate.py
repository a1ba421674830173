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

:func:`aggregate_arrayrecords` and :func:`aggregate_metricrecords` are the same means
over reply contents weighted by one of their metrics, under Flower's
``strategy_utils`` names, for a strategy written the Flower way.

The robust rules — coordinate-wise median and trimmed mean, Krum's scores, Bulyan's
mean around the median — compare the records with one another, so they take them
all at once. They read them a block of coordinates at a time (every record's values
of the same coordinates side by side, in float64), so their working memory is a
block, not a second copy of every model. They are unweighted, as in their papers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord, MetricRecord, RecordDict
from fedcore.domain.array import NDArray, SerializedArray


def _accumulator_dtype(dtype: np.dtype[Any]) -> type[np.generic]:
    return np.complex128 if dtype.kind == "c" else np.float64


def cast_back(total: NDArray, dtype: np.dtype[Any]) -> NDArray:
    """A float64 (or complex128) result back in ``dtype``: integers rounded to the
    nearest, booleans by majority. Always an array: arithmetic on a 0-d array (a
    batch-norm counter) yields a numpy scalar, which an ArrayRecord refuses."""
    if dtype.kind == "b":
        return np.asarray(total >= 0.5)
    if dtype.kind in "iu":
        return np.asarray(np.rint(total), dtype=dtype)
    return np.asarray(total, dtype=dtype)


def check_readable(record: ArrayRecord) -> None:
    """Raise ``ValueError`` if an array of ``record`` is one fedcore cannot read as numpy
    (an ``Array`` built from another serialisation's bytes): as an ndarray it is those
    bytes, and a mean of them would be a model of garbage; Flower's ``.numpy()`` refuses it."""
    for key, array in record.items():
        if isinstance(array, SerializedArray):
            try:
                array.numpy()
            except (TypeError, ValueError) as exc:
                raise ValueError(f"array {key!r} cannot be read as numpy: {exc}") from None
            raise ValueError(f"array {key!r} is kept as the bytes it was given, not an array")


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
        check_readable(arrays)
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
                key: cast_back(total / self._weight, self._layout[key].dtype)
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


def reply_weight(content: RecordDict, weighted_by_key: str) -> float:
    """The weight of a reply: metric ``weighted_by_key`` of its (first) MetricRecord;
    ``ValueError`` if it has none, or it is not a number."""
    metrics = next(iter(content.metric_records.values()), MetricRecord())
    value = metrics.get(weighted_by_key)
    if isinstance(value, list) or value is None:
        raise ValueError(f"a reply's metric {weighted_by_key!r} must be a number, got {value!r}")
    return float(value)


def metric_mean(
    contents: Sequence[RecordDict], weights: Sequence[float], exclude: str
) -> MetricRecord:
    """The weighted mean of the contents' first MetricRecords, but for ``exclude``; with
    equal weights when every reply weighs nothing (FedAvg's metrics)."""
    if sum(weights) <= 0:
        weights = [1.0] * len(weights)
    records = [next(iter(content.metric_records.values())) for content in contents]
    return weighted_average_metrics(records, weights, exclude=exclude)


def aggregate_arrayrecords(
    records: Sequence[RecordDict], weighting_metric_name: str
) -> ArrayRecord:
    """The mean of the replies' arrays (those of all their ArrayRecords, as one),
    weighted by their metric ``weighting_metric_name`` (Flower's ``strategy_utils`` name).

    As :func:`weighted_average_arrays`: float64 sums, each array back in its dtype;
    ``ValueError`` for no replies, weights summing to nothing, or arrays that differ.
    """
    weights = [reply_weight(record, weighting_metric_name) for record in records]
    arrays = [
        ArrayRecord(
            {key: array for item in record.array_records.values() for key, array in item.items()}
        )
        for record in records
    ]
    return weighted_average_arrays(arrays, weights)


def aggregate_metricrecords(
    records: Sequence[RecordDict], weighting_metric_name: str
) -> MetricRecord:
    """The mean of every metric of the replies but ``weighting_metric_name``, weighted
    by it (Flower's ``strategy_utils`` name; FedAvg's default ``*_metrics_aggr_fn``).

    Lists are averaged element by element; a metric some replies lack is averaged over
    those that have it; replies that all weigh nothing count equally.
    """
    weights = [reply_weight(record, weighting_metric_name) for record in records]
    return metric_mean(records, weights, weighting_metric_name)


_BLOCK = 1 << 20
"""Values per block of a robust rule: its float64 working copy stays at 8 MiB whatever
the size of the cohort and of the model."""


def _robust_layout(records: Sequence[ArrayRecord]) -> ArrayRecord:
    """The layout ``records`` share; ``ValueError`` if there are none, they differ, or
    an array is complex (medians and distances order values, complex numbers have no order)."""
    if not records:
        raise ValueError("nothing to aggregate")
    layout = records[0]
    check_readable(layout)
    for record in records[1:]:
        check_readable(record)
        check_same_layout(layout, record)
    for key, array in layout.items():
        if array.dtype.kind == "c":
            raise ValueError(f"array {key!r} is {array.dtype}: robust rules need real values")
    return layout


def _blocks(records: Sequence[ArrayRecord], key: str) -> Iterator[tuple[slice, NDArray]]:
    """Array ``key`` of every record, flattened, as float64 blocks of ``len(records)`` rows:
    column ``j`` of a block holds every record's value of one coordinate, which is what
    a coordinate-wise rule needs. The block is reused: a caller keeps none of it."""
    flats = [record[key].reshape(-1) for record in records]
    size = flats[0].size
    width = max(1, _BLOCK // len(records))
    block = np.empty((len(records), min(size, width)), dtype=np.float64)
    for start in range(0, size, width):
        part = slice(start, min(start + width, size))
        view = block[:, : part.stop - start]
        for row, flat in zip(view, flats, strict=True):
            row[...] = flat[part]
        yield part, view


def _coordinate_wise(
    records: Sequence[ArrayRecord], rule: Callable[[NDArray], NDArray]
) -> ArrayRecord:
    """``rule`` (a block → one value per column) applied to every coordinate."""
    layout = _robust_layout(records)
    result = {}
    for key, reference in layout.items():
        out = np.empty(reference.size, dtype=np.float64)
        for part, block in _blocks(records, key):
            out[part] = rule(block)
        result[key] = cast_back(out.reshape(reference.shape), reference.dtype)
    return ArrayRecord(result)


def coordinate_median(records: Sequence[ArrayRecord]) -> ArrayRecord:
    """The coordinate-wise median (Yin et al., 2018); with an even count, the mean of
    the two middle values."""
    return _coordinate_wise(records, lambda block: np.median(block, axis=0))


def trimmed_mean(records: Sequence[ArrayRecord], beta: float) -> ArrayRecord:
    """The coordinate-wise mean of what is left once the ``int(beta × n)`` smallest and
    as many largest of the ``n`` values are dropped (Yin et al., 2018); ``beta`` in
    [0, 0.5), so at least one value is left."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"beta must be in [0, 0.5), got {beta!r}")
    count = len(records)
    cut = int(beta * count)
    return _coordinate_wise(
        records, lambda block: np.sort(block, axis=0)[cut : count - cut].mean(axis=0)
    )


def mean_around_median(records: Sequence[ArrayRecord], keep: int) -> ArrayRecord:
    """Bulyan's coordinate-wise rule (El Mhamdi et al., 2018): the mean of the ``keep``
    values closest to the median; of values equally close, the earlier records'."""
    _check_keep(keep, len(records))
    return _coordinate_wise(
        records, lambda block: _mean_of_closest(block, np.median(block, axis=0), keep)
    )


def mean_closest_to(
    reference: ArrayRecord, records: Sequence[ArrayRecord], keep: int
) -> ArrayRecord:
    """The coordinate-wise mean of the ``keep`` values of ``records`` closest to
    ``reference``'s; of values equally close, the earlier records'. Bulyan's rule
    with the centre given (Flower's legacy ``_aggregate_n_closest_weights``)."""
    _check_keep(keep, len(records))
    return _coordinate_wise(
        [reference, *records], lambda block: _mean_of_closest(block[1:], block[0], keep)
    )


def _check_keep(keep: int, count: int) -> None:
    if not 1 <= keep <= count:
        raise ValueError(f"keep must be between 1 and {count}, got {keep}")


def _mean_of_closest(block: NDArray, centre: NDArray, keep: int) -> NDArray:
    """Per column of ``block``, the mean of the ``keep`` values closest to ``centre``'s."""
    closest = np.argsort(np.abs(block - centre), axis=0, kind="stable")[:keep]
    mean: NDArray = np.take_along_axis(block, closest, axis=0).mean(axis=0)
    return mean


def squared_distances(records: Sequence[ArrayRecord]) -> NDArray:
    """The matrix of squared Euclidean distances between ``records`` (all their arrays
    flattened end to end).

    Each block contributes ``|a|² + |b|² − 2 a·b`` (one matrix product instead of a
    subtraction per pair). The models of a round share most of their values — they
    start from the same global model — and those norms would round their small
    distances away, so the values are first centred on the coordinate-wise median: it
    takes off the common part, and unlike the mean, an outlier cannot drag it.
    """
    layout = _robust_layout(records)
    distances = np.zeros((len(records), len(records)))
    for key in layout:
        for _, block in _blocks(records, key):
            centred = block - np.median(block, axis=0)
            norms = np.einsum("ij,ij->i", centred, centred)
            distances += norms[:, None] + norms[None, :] - 2 * (centred @ centred.T)
    np.fill_diagonal(distances, 0.0)
    return np.maximum(distances, 0.0, out=distances)


def _krum_scores(distances: NDArray, candidates: list[int], num_malicious: int) -> NDArray:
    """Each candidate's Krum score among ``candidates``: the sum of its squared distances
    to its ``n − f − 2`` nearest other candidates — at least one, as in Flower, so that a
    small cohort still gets a score, and at most all ``n − 1`` of them."""
    count = len(candidates)
    nearest = min(max(count - num_malicious - 2, 1), count - 1)
    among = distances[np.ix_(candidates, candidates)]
    np.fill_diagonal(among, np.inf)
    scores: NDArray = np.sort(among, axis=1)[:, :nearest].sum(axis=1)
    return scores


def _check_selection(count: int, num_malicious: int, num_selected: int) -> None:
    if num_malicious < 0:
        raise ValueError(f"num_malicious must be >= 0, got {num_malicious}")
    if not 1 <= num_selected <= count:
        raise ValueError(f"cannot select {num_selected} of {count} records")


def krum_select(records: Sequence[ArrayRecord], num_malicious: int, num_selected: int) -> list[int]:
    """Multi-Krum (Blanchard et al., 2017): the indices of the ``num_selected`` records
    with the lowest Krum scores, best first; of equal scores, the earlier record's.
    ``num_selected=1`` is Krum."""
    _check_selection(len(records), num_malicious, num_selected)
    scores = _krum_scores(squared_distances(records), list(range(len(records))), num_malicious)
    return [int(index) for index in np.argsort(scores, kind="stable")[:num_selected]]


def iterative_krum_select(
    records: Sequence[ArrayRecord], num_malicious: int, num_selected: int
) -> list[int]:
    """Bulyan's selection (El Mhamdi et al., 2018): Krum applied ``num_selected`` times,
    each pick removed from the candidates and the scores recomputed among the rest;
    the indices in the order picked."""
    _check_selection(len(records), num_malicious, num_selected)
    distances = squared_distances(records)
    candidates = list(range(len(records)))
    picked: list[int] = []
    for _ in range(num_selected):
        scores = _krum_scores(distances, candidates, num_malicious)
        picked.append(candidates.pop(int(np.argmin(scores))))
    return picked
