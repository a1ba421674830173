"""The robust aggregation math, against numbers worked out by hand and brute-force
references written straight from the papers' definitions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedcore import ArrayRecord
from fedcore.strategy import aggregate
from fedcore.strategy.aggregate import (
    coordinate_median,
    iterative_krum_select,
    krum_select,
    mean_around_median,
    squared_distances,
    trimmed_mean,
)


def _records(*rows: list[float]) -> list[ArrayRecord]:
    return [ArrayRecord({"w": np.array(row, dtype=np.float64)}) for row in rows]


# Five updates whose Krum scores (f = 1: each update's 2 nearest others) are all distinct:
# squared distances AB 1, AC 4, AD 8, BC 5, BD 5, CD 4, and to E: 200, 181, 164, 128.
# Scores: A 1+4 = 5, B 1+5 = 6, C 4+4 = 8, D 4+5 = 9, E 128+164 = 292.
KRUM = _records([1, 1], [2, 1], [1, 3], [3, 3], [11, 11])

# Seven updates for Bulyan with f = 1 (θ = 5 selected, β = 3 kept per coordinate):
# A..E cluster, S is honest but far, O an outlier. Squared distances: AB 2, AC 8, AD 34,
# AE 65, BC 2, BD 20, BE 45, CD 10, CE 29, DE 5; S is 205 or more from every other, O ~2e6.
BULYAN = _records([0, 4], [1, 3], [2, 2], [5, 1], [7, 0], [13, 13], [1000, -1000])


def test_median_by_hand() -> None:
    odd = coordinate_median(_records([1, 10], [2, 30], [9, 20]))
    np.testing.assert_array_equal(odd["w"], [2, 20])
    even = coordinate_median(_records([1, 10], [2, 30], [9, 20], [4, 0]))
    np.testing.assert_array_equal(even["w"], [3, 15])  # (2 + 4) / 2, (10 + 20) / 2


def test_median_keeps_keys_and_shapes() -> None:
    records = [
        ArrayRecord({"m": np.full((2, 3), value), "b": np.array([-value])})
        for value in (1.0, 5.0, 2.0)
    ]
    result = coordinate_median(records)
    assert list(result) == ["m", "b"]
    np.testing.assert_array_equal(result["m"], np.full((2, 3), 2.0))
    np.testing.assert_array_equal(result["b"], [-2.0])


def test_trimmed_mean_by_hand() -> None:
    records = _records([1, -50], [2, 0], [3, 6], [4, 4], [100, 9])
    # int(0.2 × 5) = 1 cut at each end: x 2, 3, 4 → 3; y 0, 4, 6 → 10/3.
    np.testing.assert_allclose(trimmed_mean(records, 0.2)["w"], [3.0, 10 / 3])
    # int(0.2 × 4) = 0: the plain mean; int(0.25 × 4) = 1: the middle two.
    four = records[:4]
    np.testing.assert_allclose(trimmed_mean(four, 0.2)["w"], [2.5, -10.0])
    np.testing.assert_allclose(trimmed_mean(four, 0.25)["w"], [2.5, 2.0])


def test_mean_around_median_by_hand() -> None:
    records = _records([0, 4], [1, 3], [2, 2], [5, 1], [7, 0])
    # x: median 2, distances 2 1 0 3 5 → keep 2, 1, 0 → 1.
    # y: median 2, distances 2 1 0 1 2 → keep 2, 3, 1 → 2.
    np.testing.assert_array_equal(mean_around_median(records, 3)["w"], [1.0, 2.0])
    # keep 4 of y: 4 and 0 are both 2 away; the earlier record's (4) is kept → 2.5.
    np.testing.assert_array_equal(mean_around_median(records, 4)["w"], [2.0, 2.5])


def test_squared_distances_by_hand() -> None:
    distances = squared_distances(KRUM)
    # E - A = (10, 10): 200; E - D = (8, 8): 128.
    expected = [
        [0, 1, 4, 8, 200],
        [1, 0, 5, 5, 181],
        [4, 5, 0, 4, 164],
        [8, 5, 4, 0, 128],
        [200, 181, 164, 128, 0],
    ]
    np.testing.assert_array_equal(distances, expected)


def test_squared_distances_of_close_models_survive_a_huge_outlier() -> None:
    # Models a round sends back share most of their value (here 1e4) and differ by ~1e-4:
    # their squared norms (~3e8) would round their distances (~1e-8) away, unless the
    # common part is taken off first — by a centre the outlier cannot drag.
    offsets = [[1, 2, 3], [1, 2.5, 3], [1.5, 2, 3.5], [1, 2, 3.1]]
    honest = [ArrayRecord({"w": 1e4 + np.array(row) * 1e-4}) for row in offsets]
    distances = squared_distances([*honest, ArrayRecord({"w": np.array([1e9, -1e9, 1e9])})])
    stacked = np.stack([record["w"] for record in honest])
    direct = ((stacked[:, None, :] - stacked[None, :, :]) ** 2).sum(axis=-1)
    np.testing.assert_allclose(distances[:4, :4], direct, rtol=1e-6, atol=1e-20)


def test_krum_select_by_hand() -> None:
    assert krum_select(KRUM, 1, 1) == [0]
    assert krum_select(KRUM, 1, 3) == [0, 1, 2]
    # f = 0: the 3 nearest. A 1+4+8 = 13, B 1+5+5 = 11, C 4+4+5 = 13, D 4+5+8 = 17.
    assert krum_select(KRUM, 0, 2) == [1, 0]  # A and C tie: the earlier first


def test_krum_score_uses_at_least_one_neighbour() -> None:
    # n − f − 2 = 0 for two records and f = 0; both score their one distance: a tie.
    assert krum_select(_records([0.0], [3.0]), 0, 1) == [0]
    assert krum_select(_records([5.0]), 3, 1) == [0]


def test_iterative_krum_select_by_hand() -> None:
    # f = 1, each step scores the n − 3 nearest (at least 1) among those left:
    #   7 left: A 2+8+34+65=109, B 2+2+20+45=69, C 2+8+10+29=49, D 5+10+20+34=69 → C
    #   6 left: A 2+34+65=101, B 2+20+45=67, D 5+20+34=59, E 5+45+65=115 → D
    #   5 left: A 2+65=67, B 2+45=47, E 45+65=110 → B
    #   4 left: A 65, E 65 (each other's nearest): the earlier, A
    #   3 left: E 205, S 205: the earlier, E
    assert iterative_krum_select(BULYAN, 1, 5) == [2, 3, 1, 0, 4]


def _direct_krum_scores(rows: np.ndarray, f: int) -> list[float]:
    """Blanchard et al.: each row's sum of squared distances to its n − f − 2 nearest others."""
    scores = []
    for i, row in enumerate(rows):
        others = sorted(float(((row - other) ** 2).sum()) for j, other in enumerate(rows) if j != i)
        scores.append(sum(others[: len(rows) - f - 2]))
    return scores


def test_rules_match_brute_force_across_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "_BLOCK", 35)  # 7 records: 5 columns a block, the last short
    rng = np.random.default_rng(7)
    rows = [rng.normal(size=(3, 4)) for _ in range(7)]
    records = [ArrayRecord({"a": row, "b": row[0] * 2}) for row in rows]
    stacked = np.stack(rows)

    np.testing.assert_allclose(coordinate_median(records)["a"], np.median(stacked, axis=0))
    ordered = np.sort(stacked, axis=0)
    np.testing.assert_allclose(trimmed_mean(records, 0.3)["a"], ordered[2:5].mean(axis=0))
    gap = np.abs(stacked - np.median(stacked, axis=0))
    closest = np.take_along_axis(stacked, np.argsort(gap, axis=0)[:3], axis=0)
    np.testing.assert_allclose(mean_around_median(records, 3)["a"], closest.mean(axis=0))

    flat = np.stack([np.concatenate([row.ravel(), row[0] * 2]) for row in rows])
    scores = _direct_krum_scores(flat, 2)
    assert krum_select(records, 2, 7) == list(np.argsort(scores, kind="stable"))
    left, picked = list(range(7)), []
    for _ in range(3):  # El Mhamdi et al.: Krum on what is left, 3 times (f = 1)
        scores = _direct_krum_scores(flat[left], 1)
        picked.append(left.pop(int(np.argmin(scores))))
    assert iterative_krum_select(records, 1, 3) == picked


@pytest.mark.parametrize(
    "rule",
    [
        coordinate_median,
        lambda records: trimmed_mean(records, 0.2),
        lambda records: mean_around_median(records, 3),
    ],
    ids=["median", "trimmed_mean", "mean_around_median"],
)
def test_dtypes_are_kept(rule: Callable[[list[ArrayRecord]], ArrayRecord]) -> None:
    records = [
        ArrayRecord({"f": np.array([value, 2 * value], np.float32), "n": np.array([value])})
        for value in (1, 2, 4, 9, 3)
    ]
    result = rule(records)
    assert result["f"].dtype == np.float32
    assert result["n"].dtype == np.int64


def test_integers_round_to_the_nearest() -> None:
    # median of 1 2 4 9 is 3; trimmed mean of 1 2 4 (cut 1 of 5 each end) is 7/3 → 2.
    ints = [ArrayRecord({"n": np.array([v])}) for v in (1, 2, 4, 9)]
    np.testing.assert_array_equal(coordinate_median(ints)["n"], [3])
    five = [*ints, ArrayRecord({"n": np.array([0])})]
    np.testing.assert_array_equal(trimmed_mean(five, 0.2)["n"], [2])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: coordinate_median([]), "nothing to aggregate"),
        (lambda: coordinate_median(_records([1.0], [1.0, 2.0])), "expected"),
        (
            lambda: coordinate_median([ArrayRecord({"z": np.array([1j])})]),
            "'z' is complex128: robust rules need real values",
        ),
        (lambda: trimmed_mean(_records([1.0]), 0.5), r"beta must be in \[0, 0.5\), got 0.5"),
        (lambda: trimmed_mean(_records([1.0]), -0.1), "got -0.1"),
        (lambda: mean_around_median(_records([1.0], [2.0]), 3), "keep must be between 1 and 2"),
        (lambda: mean_around_median(_records([1.0]), 0), "got 0"),
        (lambda: krum_select(_records([1.0]), 0, 2), "cannot select 2 of 1 records"),
        (lambda: krum_select(_records([1.0]), -1, 1), "num_malicious must be >= 0, got -1"),
        (lambda: iterative_krum_select(_records([1.0]), 0, 0), "cannot select 0 of 1"),
        (lambda: squared_distances([]), "nothing to aggregate"),
    ],
)
def test_bad_inputs(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
