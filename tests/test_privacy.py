"""Differential-privacy math: update norms, clipping and noise, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.domain import ArrayRecord
from fedcore.privacy import add_gaussian_noise, clip_update, noise_std, update_norm

SENT = ArrayRecord({"w": np.array([1.0, 1.0]), "b": np.array([0.0], dtype=np.float32)})


def test_the_norm_runs_over_every_array_together() -> None:
    reply = ArrayRecord({"w": np.array([4.0, 5.0]), "b": np.array([12.0], dtype=np.float32)})
    assert update_norm(reply, SENT) == 13.0  # update (3, 4, 12)


def test_the_norm_ignores_key_order() -> None:
    reply = ArrayRecord({"b": np.array([12.0], dtype=np.float32), "w": np.array([4.0, 5.0])})
    assert update_norm(reply, SENT) == 13.0


def test_the_norm_of_low_precision_arrays_is_taken_in_float64() -> None:
    sent = ArrayRecord({"h": np.zeros(3, dtype=np.float16)})
    reply = ArrayRecord({"h": np.full(3, 60000.0, dtype=np.float16)})  # squares overflow float16
    assert update_norm(reply, sent) == pytest.approx(60000.0 * math.sqrt(3))


def test_a_long_update_is_scaled_to_the_norm() -> None:
    reply = ArrayRecord({"w": np.array([4.0, 5.0]), "b": np.array([12.0], dtype=np.float32)})

    clipped = clip_update(reply, SENT, 6.5)

    assert clipped.norm == 13.0
    assert clipped.scale == 0.5
    assert clipped.clipped
    np.testing.assert_allclose(clipped.arrays["w"], [2.5, 3.0])  # 1 + 1.5, 1 + 2
    np.testing.assert_allclose(clipped.arrays["b"], [6.0])
    assert clipped.arrays["b"].dtype == np.float32
    assert list(clipped.arrays) == ["w", "b"]
    assert reply["w"].tolist() == [4.0, 5.0]  # the reply is not changed


@pytest.mark.parametrize("norm", [13.0, 100.0])
def test_an_update_within_the_norm_is_left_as_it_is(norm: float) -> None:
    reply = ArrayRecord({"w": np.array([4.0, 5.0]), "b": np.array([12.0], dtype=np.float32)})

    clipped = clip_update(reply, SENT, norm)

    assert clipped.arrays is reply
    assert clipped.scale == 1.0
    assert not clipped.clipped


def test_no_update_is_left_as_it_is() -> None:
    clipped = clip_update(SENT, SENT, 1.0)
    assert (clipped.norm, clipped.scale, clipped.arrays) == (0.0, 1.0, SENT)


def test_integer_and_boolean_arrays_are_rounded_back() -> None:
    sent = ArrayRecord({"n": np.array([10, 10], dtype=np.int64), "m": np.array([False, True])})
    reply = ArrayRecord({"n": np.array([13, 14], dtype=np.int64), "m": np.array([True, True])})
    # update (3, 4, 1, 0), norm sqrt(26); scaled to 1: (0.588, 0.784, 0.196, 0)
    clipped = clip_update(reply, sent, 1.0)

    assert clipped.arrays["n"].tolist() == [11, 11]
    assert clipped.arrays["n"].dtype == np.int64
    assert clipped.arrays["m"].tolist() == [False, True]


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (ArrayRecord({"w": np.zeros(2)}), r"the reply has arrays \['w'\], but \['w', 'b'\]"),
        (
            ArrayRecord({"w": np.zeros(3), "b": np.zeros(1)}),
            r"array 'w' has shape \[3\], but was sent as \[2\]",
        ),
        (
            ArrayRecord({"w": np.array([np.nan, 0.0]), "b": np.zeros(1)}),
            "non-finite entries",
        ),
        (
            ArrayRecord({"w": np.array([np.inf, 0.0]), "b": np.zeros(1)}),
            "non-finite entries",
        ),
    ],
)
def test_an_update_that_cannot_be_clipped_is_a_value_error(reply: ArrayRecord, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        clip_update(reply, SENT, 1.0)


@pytest.mark.parametrize("norm", [0.0, -1.0, math.nan])
def test_the_clipping_norm_must_be_positive(norm: float) -> None:
    with pytest.raises(ValueError, match="clipping_norm must be > 0"):
        clip_update(SENT, SENT, norm)


def test_complex_arrays_are_refused() -> None:
    record = ArrayRecord({"z": np.zeros(2, dtype=np.complex128)})
    with pytest.raises(TypeError, match="array 'z' is complex"):
        update_norm(record, record)
    with pytest.raises(TypeError, match="array 'z' is complex"):
        add_gaussian_noise(record, 1.0, np.random.default_rng(0))


def test_noise_std_is_the_multiplier_times_the_norm_over_the_clients() -> None:
    assert noise_std(1.5, 4.0, 10) == pytest.approx(0.6)


def test_noise_has_the_given_std_and_comes_from_the_generator() -> None:
    arrays = ArrayRecord({"w": np.full((200, 100), 3.0), "b": np.full(5000, -1.0)})

    noisy = add_gaussian_noise(arrays, 0.25, np.random.default_rng(42))

    expected = np.random.default_rng(42)
    np.testing.assert_array_equal(noisy["w"], 3.0 + expected.normal(0.0, 0.25, (200, 100)))
    np.testing.assert_array_equal(noisy["b"], -1.0 + expected.normal(0.0, 0.25, 5000))
    noise = np.concatenate([(noisy["w"] - 3.0).ravel(), noisy["b"] + 1.0])
    assert noise.std() == pytest.approx(0.25, rel=0.02)
    assert abs(noise.mean()) < 0.01
    assert arrays["w"][0, 0] == 3.0  # the input is not changed


def test_noise_keeps_dtypes_rounding_and_saturating_integers() -> None:
    arrays = ArrayRecord({"f": np.zeros(3, dtype=np.float32), "u": np.full(1000, 1, np.uint8)})

    noisy = add_gaussian_noise(arrays, 200.0, np.random.default_rng(0))

    expected = np.random.default_rng(0)
    f = expected.normal(0.0, 200.0, 3)
    u = 1 + expected.normal(0.0, 200.0, 1000)
    assert noisy["f"].dtype == np.float32
    np.testing.assert_allclose(noisy["f"], f, rtol=1e-6)
    assert noisy["u"].dtype == np.uint8
    assert noisy["u"].tolist() == [0 if x < 0.5 else 255 if x > 254.5 else round(x) for x in u]
    assert 0 < noisy["u"].tolist().count(0) < 1000  # below zero saturates, never wraps around


def test_zero_noise_returns_the_arrays_and_draws_nothing() -> None:
    rng = np.random.default_rng(3)

    noisy = add_gaussian_noise(SENT, 0.0, rng)

    assert noisy["w"].numpy() is SENT["w"].numpy()  # the very array SENT holds
    assert rng.random() == np.random.default_rng(3).random()


@pytest.mark.parametrize("std", [-0.1, math.inf, math.nan])
def test_a_bad_std_is_a_value_error(std: float) -> None:
    with pytest.raises(ValueError, match="noise std must be a finite number >= 0"):
        add_gaussian_noise(SENT, std, np.random.default_rng(0))


def test_0d_arrays_are_clipped_and_noised_as_0d_arrays() -> None:
    """numpy arithmetic on a 0-d array gives a scalar; the records get 0-d arrays back."""
    sent = ArrayRecord({"s": np.array(0.0), "n": np.array(1, dtype=np.int32)})
    reply = ArrayRecord({"s": np.array(3.0), "n": np.array(5, dtype=np.int32)})
    clipped = clip_update(reply, sent, 2.5)  # update (3, 4), norm 5, halved
    assert clipped.scale == 0.5
    for key, value in {"s": 1.5, "n": 3}.items():
        array = clipped.arrays[key]
        assert isinstance(array, np.ndarray)
        assert (array.shape, array.dtype, array.item()) == ((), reply[key].dtype, value)
    noisy = add_gaussian_noise(clipped.arrays, 0.1, np.random.default_rng(0))
    assert [(noisy[key].shape, noisy[key].dtype) for key in noisy] == [
        ((), np.dtype(np.float64)),
        ((), np.dtype(np.int32)),
    ]
