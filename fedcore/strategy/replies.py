"""Which training replies a strategy aggregates: each is checked against the message it answers.

A reply is data from a peer. Averaged as it comes, one NaN makes the model NaN for
good, one weight of ``inf`` does the same, and a layout taken from whichever reply
came first lets a node that answers first decide what the honest ones must look
like. So the round driver (:mod:`fedcore.strategy.rounds`, and FedBuff's scheduler)
hands every training reply that is not an error to the strategy's
:meth:`~fedcore.strategy.base.Strategy.check_train_reply` before the strategy
aggregates it, and that check is :func:`check_train_reply`:

- the reply's ArrayRecords, in order, have the names, shapes and dtypes of the
  ArrayRecords the message sent (when it sent any, and the strategy expects its
  model back — FedXgb's replies are trees of their own length, and are not held
  to the sent layout). An array of another dtype of the same kind (float64 for a
  float32 model: numpy promotes easily) is cast to the dtype sent, so the model
  keeps its own; one of another kind (an int for a float) is refused;
- every float and complex value is finite;
- its weight, for a strategy that weighs replies (FedAvg's ``weighted_by_key``), is
  a number from 0 to :data:`MAX_WEIGHT`.

A reply that fails is refused with :class:`~fedcore.errors.RefusedReplyError`: a
failure of its round, counted in the round's summary under the error's label
(``"refused: non-finite"``) and logged with its reason, never aggregated. A strategy
built with ``validate_replies=False`` skips this, as Flower does.

What is still open: a weight up to :data:`MAX_WEIGHT` is a count like any other, so
a node that claims many examples still dominates a weighted mean, and finite values
can still pull the mean anywhere. Bounding one node's influence is the work of the
unweighted robust rules (FedMedian, FedTrimmedAvg, Krum, Bulyan); docs/security.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedcore.domain import ArrayRecord, RecordDict
from fedcore.domain.array import NDArray
from fedcore.errors import RefusedReplyError
from fedcore.strategy.aggregate import check_readable

MAX_WEIGHT = float(2**53)
"""The largest weight a reply may claim: 2^53, past which float64 no longer counts
every integer, so no honest count of examples. It keeps a round's total weight far
from overflowing, which would make the mean NaN; below it a weight is believed."""


def check_train_reply(
    sent: RecordDict,
    reply: RecordDict,
    *,
    weighted_by_key: str | None = None,
    same_layout: bool = True,
) -> RecordDict:
    """``reply``, the content of a training reply, as it may be aggregated given
    ``sent``, the content of the message it answers: itself, or a copy whose arrays of
    another precision are cast to the dtypes sent. Raises
    :class:`~fedcore.errors.RefusedReplyError` unless its arrays are laid out as those
    sent (when ``same_layout`` and any were sent) and finite, and it weighs a count
    (its first MetricRecord's ``weighted_by_key``, when given). The label says which:
    ``unreadable``, ``layout``, ``non-finite``, ``weight``."""
    names, records = list(reply.array_records), list(reply.array_records.values())
    for record in records:
        check_readable_arrays(record)
    expected = list(sent.array_records.values())
    if same_layout and expected:
        records = as_sent(expected, records)
    for record in records:
        check_finite(record)
    if weighted_by_key is not None:
        metrics = next(iter(reply.metric_records.values()), None)
        check_weight(None if metrics is None else metrics.get(weighted_by_key), weighted_by_key)
    if all(new is old for new, old in zip(records, reply.array_records.values(), strict=True)):
        return reply
    return RecordDict({**reply, **dict(zip(names, records, strict=True))})


def as_sent(expected: list[ArrayRecord], records: list[ArrayRecord]) -> list[ArrayRecord]:
    """``records`` with ``expected``'s count of ArrayRecords, each with the names and
    shapes of its counterpart, and its dtypes — an array of another dtype of the same
    kind cast to it; else refused as ``layout``."""
    if len(records) != len(expected):
        raise RefusedReplyError(
            "layout", f"{len(records)} ArrayRecords, expected {len(expected)} as sent"
        )
    return [_record_as_sent(ref, record) for ref, record in zip(expected, records, strict=True)]


def _record_as_sent(reference: ArrayRecord, record: ArrayRecord) -> ArrayRecord:
    if list(record) != list(reference):
        raise RefusedReplyError("layout", f"arrays {list(record)}, sent {list(reference)}")
    cast: dict[str, NDArray] = {}
    for key, array in record.items():
        want = reference[key]
        if array.shape != want.shape or _kind(array.dtype) != _kind(want.dtype):
            raise RefusedReplyError(
                "layout",
                f"array {key!r} is {array.dtype}{list(array.shape)}, "
                f"sent {want.dtype}{list(want.shape)}",
            )
        if array.dtype != want.dtype:
            with np.errstate(over="ignore", invalid="ignore"):  # too large: infinite, refused
                cast[key] = np.asarray(array.astype(want.dtype))
    if not cast:
        return record
    return ArrayRecord({key: cast.get(key, array) for key, array in record.items()})


def _kind(dtype: np.dtype[Any]) -> str:
    """The kind of number a dtype holds, signed and unsigned integers alike."""
    return "i" if dtype.kind == "u" else dtype.kind


def check_readable_arrays(record: ArrayRecord) -> None:
    """Every array of ``record`` reads as numpy; else refused as ``unreadable`` (bytes
    of a serialisation fedcore does not read)."""
    try:
        check_readable(record)
    except ValueError as exc:
        raise RefusedReplyError("unreadable", str(exc)) from None


def check_finite(record: ArrayRecord) -> None:
    """Every float and complex value of ``record`` is finite; else refused as ``non-finite``."""
    for key, array in record.items():
        if not _finite(array):
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            raise RefusedReplyError(
                "non-finite", f"array {key!r} holds {bad} NaN or infinite values"
            )


def _finite(array: NDArray) -> bool:
    """Whether every value of ``array`` is finite. A sum in float64 is NaN or infinite
    when one value is, and reads the array once without a mask of its size; only when
    the sum is not finite (or overflowed) is every value looked at."""
    if array.dtype.kind not in "fc":
        return True
    accumulator = np.complex128 if array.dtype.kind == "c" else np.float64
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(array.reshape(-1), dtype=accumulator)
    return bool(np.isfinite(total)) or bool(np.isfinite(array).all())


def check_weight(value: object, weighted_by_key: str) -> float:
    """``value`` as a weight: a number from 0 to :data:`MAX_WEIGHT`; else refused as
    ``weight`` (missing, not a number, negative, NaN, infinite or past the cap)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RefusedReplyError(
            "weight", f"metric {weighted_by_key!r} must be a number, got {value!r}"
        )
    weight = float(value) if abs(value) <= MAX_WEIGHT else math.inf
    if not (math.isfinite(weight) and weight >= 0):
        raise RefusedReplyError(
            "weight",
            f"metric {weighted_by_key!r} must be a count from 0 to 2^53, got {value!r}",
        )
    return weight
