"""Aggregation math against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import ArrayRecord, MetricRecord
from fedcore.domain.array import Array
from fedcore.strategy.aggregate import (
    coordinate_median,
    weighted_average_arrays,
    weighted_average_metrics,
)


def test_weighted_mean_by_hand() -> None:
    a = ArrayRecord({"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.0], np.float32)})
    b = ArrayRecord({"w": np.array([4.0, 8.0], np.float32), "b": np.array([3.0], np.float32)})
    mean = weighted_average_arrays([a, b], [1, 2])
    # w: (1·[1,2] + 2·[4,8]) / 3 = [3, 6];  b: (0 + 2·3) / 3 = 2
    np.testing.assert_array_equal(mean["w"], [3.0, 6.0])
    np.testing.assert_array_equal(mean["b"], [2.0])
    assert mean["w"].dtype == np.float32
    assert list(mean) == ["w", "b"]


def test_integer_and_bool_arrays_round() -> None:
    a = ArrayRecord({"n": np.array([1, 10]), "m": np.array([True, False])})
    b = ArrayRecord({"n": np.array([2, 11]), "m": np.array([True, True])})
    mean = weighted_average_arrays([a, b], [1, 1])
    np.testing.assert_array_equal(mean["n"], [2, 10])  # 1.5 and 10.5 round to even
    assert mean["n"].dtype == np.int64
    np.testing.assert_array_equal(mean["m"], [True, True])


def test_float16_mean_is_summed_in_float64() -> None:
    records = [ArrayRecord({"w": np.array([2048.0], np.float16)})] + [
        ArrayRecord({"w": np.array([1.0], np.float16)}) for _ in range(8)
    ]
    mean = weighted_average_arrays(records, [1] * 9)
    assert mean["w"].dtype == np.float16
    assert float(mean["w"][0]) == pytest.approx((2048 + 8) / 9, rel=1e-3)


def test_zero_weight_records_count_for_nothing() -> None:
    a = ArrayRecord({"w": np.array([5.0])})
    b = ArrayRecord({"w": np.array([100.0])})
    np.testing.assert_array_equal(weighted_average_arrays([a, b], [3, 0])["w"], [5.0])


@pytest.mark.parametrize(
    ("records", "weights", "message"),
    [
        ([], [], "nothing to average"),
        ([ArrayRecord({"w": np.zeros(1)})], [0], "positive"),
        ([ArrayRecord({"w": np.zeros(1)})], [1, 2], "1 records but 2 weights"),
        (
            [ArrayRecord({"w": np.zeros(1)}), ArrayRecord({"v": np.zeros(1)})],
            [1, 1],
            "do not match",
        ),
        ([ArrayRecord({"w": np.zeros(1)}), ArrayRecord({"w": np.zeros(2)})], [1, 1], "expected"),
        (
            [ArrayRecord({"w": np.zeros(1)}), ArrayRecord({"w": np.zeros(1, np.float32)})],
            [1, 1],
            "expected float64",
        ),
    ],
)
def test_bad_inputs(records: list[ArrayRecord], weights: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        weighted_average_arrays(records, weights)


def test_metrics_weighted_mean_excludes_the_weight_key() -> None:
    a = MetricRecord({"num-examples": 1, "loss": 1.0, "hist": [1.0, 0.0]})
    b = MetricRecord({"num-examples": 3, "loss": 3.0, "hist": [0.0, 4.0], "extra": 7})
    mean = weighted_average_metrics([a, b], [1, 3], exclude="num-examples")
    assert mean["loss"] == pytest.approx(2.5)  # (1 + 9) / 4
    assert mean["hist"] == pytest.approx([0.25, 3.0])
    assert mean["extra"] == 7.0  # only b has it: its own value
    assert "num-examples" not in mean


def test_zero_dimensional_arrays_average_to_arrays() -> None:
    """Batch-norm's num_batches_tracked is a 0-d int64 tensor."""
    records = [
        ArrayRecord({"count": np.array(3, dtype=np.int64), "w": np.array(1.0, dtype=np.float32)}),
        ArrayRecord({"count": np.array(6, dtype=np.int64), "w": np.array(2.0, dtype=np.float32)}),
    ]
    mean = weighted_average_arrays(records, [1.0, 2.0])
    assert mean["count"].shape == ()
    assert mean["count"].dtype == np.int64
    assert int(mean["count"]) == 5
    assert mean["w"].dtype == np.float32
    assert float(mean["w"]) == pytest.approx(5 / 3)


@pytest.mark.parametrize(
    ("stype", "data"),
    [("torch.raw", b"\x01\x02\x03\x04"), ("numpy.ndarray", b"not numpy.save output")],
)
def test_an_array_kept_as_unreadable_bytes_is_refused_not_averaged(stype: str, data: bytes) -> None:
    """Flower's Array(dtype, shape, stype, data) keeps bytes it cannot read; with the
    right dtype and shape they would pass the layout check and be averaged as numbers."""
    unreadable = Array("uint8", (4,), stype, data)
    good = ArrayRecord({"w": np.ones(4, dtype=np.uint8)})
    for records in ([good, ArrayRecord({"w": unreadable})], [ArrayRecord({"w": unreadable})]):
        with pytest.raises(ValueError, match="'w' cannot be read as numpy"):
            weighted_average_arrays(records, [1.0] * len(records))
        with pytest.raises(ValueError, match="'w' cannot be read as numpy"):
            coordinate_median(records)
