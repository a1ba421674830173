"""Size-skew partitioners: hand-checked sizes, the share bound, IID label mix, errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.data import (
    ExponentialPartitioner,
    LinearPartitioner,
    PowerLawPartitioner,
    label_distribution,
)


@pytest.mark.parametrize(
    ("partitioner", "sizes"),
    [
        # Shares 2, 4, 6, 8: exact.
        (LinearPartitioner(4), [2, 4, 6, 8]),
        # Shares 3.33, 6.67, 10: floors 3, 6, 10; the spare sample to the .67.
        (LinearPartitioner(3), [3, 7, 10]),
        # Shares 20/7 x (1, 2, 4) = 2.86, 5.71, 11.43: floors sum to 18; spares to .86, .71.
        (ExponentialPartitioner(3, base=2), [3, 6, 11]),
        # Weights 1/3, 1/2, 1 -> shares 3.64, 5.45, 10.91: spares to .91, .64.
        (PowerLawPartitioner(3), [4, 5, 11]),
        # Weights 1/9, 1/4, 1 -> shares 20 x (4, 9, 36) / 49 = 1.63, 3.67, 14.69:
        # floors sum to 18; spares to .69 and .67, not to .63.
        (PowerLawPartitioner(3, exponent=2), [1, 4, 15]),
    ],
    ids=repr,
)
def test_sizes_for_twenty_samples_by_hand(partitioner: Any, sizes: list[int]) -> None:
    assert partitioner.partition_sizes(20).tolist() == sizes
    parts = partitioner.split(np.zeros(20))
    assert [len(part) for part in parts] == sizes


def test_default_exponential_base_is_e() -> None:
    # 100 x (1, e, e^2) / (1 + e + e^2) = 9.003, 24.47, 66.52 -> 9, 24, 67.
    assert ExponentialPartitioner(3).partition_sizes(100).tolist() == [9, 24, 67]


def exact_shares(law: str, num_partitions: int, param: float, n: int) -> np.ndarray:
    """The documented laws, written out independently of the code under test."""
    i = np.arange(num_partitions, dtype=np.float64)
    weights = {
        "linear": i + 1,
        "exponential": np.exp((i - (num_partitions - 1)) * math.log(param)),
        "power_law": (num_partitions - i) ** -param,
    }[law]
    return n * weights / weights.sum()


def make(law: str, num_partitions: int, param: float, seed: int = 0) -> Any:
    if law == "linear":
        return LinearPartitioner(num_partitions, seed=seed)
    if law == "exponential":
        return ExponentialPartitioner(num_partitions, base=param, seed=seed)
    return PowerLawPartitioner(num_partitions, exponent=param, seed=seed)


@given(
    law=st.sampled_from(["linear", "exponential", "power_law"]),
    num_partitions=st.integers(1, 40),
    param=st.floats(1.001, 3.0),
    n=st.integers(0, 3000),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=200, deadline=None)
def test_size_skew_properties(
    law: str, num_partitions: int, param: float, n: int, seed: int
) -> None:
    partitioner = make(law, num_partitions, param, seed)
    shares = exact_shares(law, num_partitions, param, n)
    labels = np.random.default_rng(seed).integers(0, 4, n)
    try:
        sizes = partitioner.partition_sizes(n)
    except ValueError:
        assert shares[0] < 1  # a share of one or more always rounds to a sample
        with pytest.raises(ValueError, match="at least one sample"):
            partitioner.split(labels)
        return
    assert sizes.sum() == n
    assert sizes.min() >= 1
    assert np.all(np.diff(sizes) >= 0)
    assert np.all(np.abs(sizes - shares) < 1 + 1e-9)
    parts = partitioner.split(labels)
    assert [len(part) for part in parts] == sizes.tolist()
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    again = make(law, num_partitions, param, seed).split(labels)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@pytest.mark.parametrize("law", ["linear", "exponential", "power_law"])
def test_seed_moves_samples_but_not_sizes(law: str) -> None:
    labels = np.zeros(500)
    first, other = make(law, 5, 1.5, seed=1).split(labels), make(law, 5, 1.5, seed=2).split(labels)
    assert [len(p) for p in first] == [len(p) for p in other]
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_label_mix_is_iid_whatever_the_size() -> None:
    labels = np.repeat(np.arange(10), 1000)
    parts = LinearPartitioner(4, seed=0).split(labels)
    fractions = label_distribution(labels, parts) / np.array([[len(p)] for p in parts])
    # The smallest partition has 1,000 samples: each class fraction is 0.1 ± ~0.01.
    assert np.all(np.abs(fractions - 0.1) < 0.04)


def test_power_law_top_tenth_holds_most() -> None:
    sizes = PowerLawPartitioner(100).partition_sizes(100_000)
    harmonic = sum(1 / r for r in range(1, 101))
    expected_top_ten = sum(1 / r for r in range(1, 11)) / harmonic  # 0.5646
    assert abs(sizes[-10:].sum() / 100_000 - expected_top_ten) < 1e-3


def test_too_steep_or_too_few_samples_raise_with_advice() -> None:
    with pytest.raises(ValueError, match=r"partition 0 a share of 0\.000212 .* base closer to 1"):
        ExponentialPartitioner(20).partition_sizes(60_000)
    with pytest.raises(ValueError, match="or a smaller exponent"):
        PowerLawPartitioner(10, exponent=8).partition_sizes(1000)
    with pytest.raises(ValueError, match=r"fewer partitions$"):
        LinearPartitioner(5).split(np.arange(4))
    with pytest.raises(ValueError, match="at least one sample"):
        LinearPartitioner(1).split(np.arange(0))


@pytest.mark.parametrize(
    ("cls", "kwargs", "error"),
    [
        (ExponentialPartitioner, {"base": 1}, ValueError),
        (ExponentialPartitioner, {"base": 0.5}, ValueError),
        (ExponentialPartitioner, {"base": float("inf")}, ValueError),
        (ExponentialPartitioner, {"base": "2"}, TypeError),
        (PowerLawPartitioner, {"exponent": 0}, ValueError),
        (PowerLawPartitioner, {"exponent": float("nan")}, ValueError),
        (PowerLawPartitioner, {"exponent": True}, TypeError),
        (LinearPartitioner, {"num_partitions": 0}, ValueError),
        (LinearPartitioner, {"seed": 0.5}, TypeError),
    ],
)
def test_bad_size_skew_arguments_raise(
    cls: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        cls(**{"num_partitions": 3, **kwargs})


def test_partition_sizes_checks_num_samples() -> None:
    with pytest.raises(ValueError, match="num_samples"):
        LinearPartitioner(3).partition_sizes(-1)
    with pytest.raises(TypeError, match="num_samples"):
        LinearPartitioner(3).partition_sizes(20.0)  # type: ignore[arg-type]


def test_size_skew_reprs() -> None:
    assert repr(LinearPartitioner(3)) == "LinearPartitioner(num_partitions=3, seed=0)"
    assert repr(ExponentialPartitioner(3, base=2, seed=1)) == (
        "ExponentialPartitioner(num_partitions=3, base=2.0, seed=1)"
    )
    assert repr(PowerLawPartitioner(3)) == (
        "PowerLawPartitioner(num_partitions=3, exponent=1.0, seed=0)"
    )
