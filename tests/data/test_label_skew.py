"""Pathological and shard partitioners: hand-checked splits, properties, errors."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.data import PathologicalPartitioner, ShardPartitioner, label_distribution

FOUR_BY_FIVE = np.repeat(np.arange(4), 5)  # 20 samples, classes 0..3, five each
MODES = ["random", "deterministic", "first-deterministic"]


def assert_disjoint_sorted(parts: list[np.ndarray], n: int, num_partitions: int) -> np.ndarray:
    """Checks the parts; returns the indices that are in no partition."""
    assert len(parts) == num_partitions
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined))
    assert np.all((joined >= 0) & (joined < n))
    return np.setdiff1d(np.arange(n), joined)


def same_split(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --- PathologicalPartitioner ---------------------------------------------------------


def test_deterministic_mode_by_hand() -> None:
    # Partition p holds classes p and p+1 (mod 4); each class is held by two partitions,
    # and its 5 samples split 3 (lower partition id) / 2.
    parts = PathologicalPartitioner(
        4, num_classes_per_partition=2, class_assignment_mode="deterministic"
    ).split(FOUR_BY_FIVE)
    assert label_distribution(FOUR_BY_FIVE, parts).tolist() == [
        [3, 3, 0, 0],
        [0, 2, 3, 0],
        [0, 0, 2, 3],
        [2, 0, 0, 2],
    ]
    assert len(assert_disjoint_sorted(parts, 20, 4)) == 0


def test_first_deterministic_with_one_class_gives_partition_p_class_p() -> None:
    labels = np.array(["emu", "cat", "dog", "cat", "emu", "dog", "cat"])
    parts = PathologicalPartitioner(
        3, num_classes_per_partition=1, class_assignment_mode="first-deterministic", seed=5
    ).split(labels)
    # Classes are the sorted labels: cat, dog, emu.
    assert [part.tolist() for part in parts] == [[1, 3, 6], [2, 5], [0, 4]]


def test_random_mode_with_every_class_halves_each_class() -> None:
    parts = PathologicalPartitioner(2, num_classes_per_partition=4).split(FOUR_BY_FIVE)
    assert label_distribution(FOUR_BY_FIVE, parts).tolist() == [[3, 3, 3, 3], [2, 2, 2, 2]]


def test_first_deterministic_starts_each_partition_at_its_own_class() -> None:
    labels = np.repeat(np.arange(5), 40)
    parts = PathologicalPartitioner(
        12, num_classes_per_partition=3, class_assignment_mode="first-deterministic", seed=2
    ).split(labels)
    for pid, part in enumerate(parts):
        held = set(np.unique(labels[part]).tolist())
        assert len(held) == 3
        assert pid % 5 in held


def test_unused_classes_are_left_out_with_a_warning() -> None:
    partitioner = PathologicalPartitioner(
        2, num_classes_per_partition=1, class_assignment_mode="deterministic"
    )
    with pytest.warns(UserWarning, match=r"classes \[2, 3\]; their 10 samples are left out"):
        parts = partitioner.split(FOUR_BY_FIVE)
    assert [part.tolist() for part in parts] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


@given(
    class_sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    num_partitions=st.integers(1, 12),
    k=st.integers(1, 6),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_pathological_properties(
    class_sizes: list[int], num_partitions: int, k: int, mode: Any, seed: int
) -> None:
    # Each class gets at least num_partitions samples, so no class can be overcrowded.
    sizes = [size + num_partitions for size in class_sizes]
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(sizes)), sizes))
    partitioner = PathologicalPartitioner(
        num_partitions, num_classes_per_partition=k, class_assignment_mode=mode, seed=seed
    )
    if k > len(sizes):
        with pytest.raises(ValueError, match="exceeds"):
            partitioner.split(labels)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = partitioner.split(labels)
    left_out = assert_disjoint_sorted(parts, len(labels), num_partitions)
    held = [set(np.unique(labels[part]).tolist()) for part in parts]
    assert all(len(classes) == k for classes in held)
    unused = set(range(len(sizes))) - set().union(*held)
    # Exactly the samples of classes nobody holds are left out, and then only with a warning.
    assert set(left_out.tolist()) == {i for i in range(len(labels)) if labels[i] in unused}
    assert len(caught) == (1 if unused else 0)
    again = PathologicalPartitioner(
        num_partitions, num_classes_per_partition=k, class_assignment_mode=mode, seed=seed
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same_split(parts, again.split(labels))


@pytest.mark.filterwarnings("ignore:.*are left out:UserWarning")
@pytest.mark.parametrize("mode", MODES)
def test_pathological_seed_changes_the_split(mode: Any) -> None:
    labels = np.repeat(np.arange(10), 30)

    def split(seed: int) -> list[np.ndarray]:
        return PathologicalPartitioner(
            10, num_classes_per_partition=2, class_assignment_mode=mode, seed=seed
        ).split(labels)

    assert same_split(split(3), split(3))
    assert not same_split(split(3), split(4))


def test_overcrowded_class_raises_with_advice() -> None:
    partitioner = PathologicalPartitioner(
        2, num_classes_per_partition=2, class_assignment_mode="deterministic"
    )
    with pytest.raises(ValueError, match="class 7 has 1 samples but 2 partitions hold it"):
        partitioner.split(np.array([3, 3, 7, 3]))


def test_more_classes_per_partition_than_classes_raises() -> None:
    with pytest.raises(ValueError, match="num_classes_per_partition=5 exceeds the 4 classes"):
        PathologicalPartitioner(2, num_classes_per_partition=5).split(FOUR_BY_FIVE)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_classes_per_partition": 0}, ValueError),
        ({"num_classes_per_partition": 2.0}, TypeError),
        ({"class_assignment_mode": "first_deterministic"}, ValueError),
        ({"class_assignment_mode": 1}, TypeError),
        ({"num_partitions": 0}, ValueError),
        ({"seed": -1}, ValueError),
    ],
)
def test_bad_pathological_arguments_raise(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        PathologicalPartitioner(**{"num_partitions": 3, "num_classes_per_partition": 2, **kwargs})


def test_pathological_repr() -> None:
    assert repr(PathologicalPartitioner(4, num_classes_per_partition=2, seed=1)) == (
        "PathologicalPartitioner(num_partitions=4, num_classes_per_partition=2, "
        "class_assignment_mode='random', seed=1)"
    )


# --- ShardPartitioner ----------------------------------------------------------------


def test_shards_of_one_class_each_by_hand() -> None:
    # Shards of 5 in label order are exactly the four classes; each partition gets two.
    labels = np.random.default_rng(0).permutation(FOUR_BY_FIVE)
    parts = ShardPartitioner(2, num_shards_per_partition=2, shard_size=5, seed=4).split(labels)
    counts = label_distribution(labels, parts)
    assert sorted(row.tolist() for row in np.sort(counts, axis=1)) == [[0, 0, 5, 5]] * 2
    assert len(assert_disjoint_sorted(parts, 20, 2)) == 0


def test_derived_shard_size_leaves_out_the_tail_in_label_order() -> None:
    # 20 samples into 3 x 2 shards: shard_size 20 // 6 = 3, so positions 18 and 19 of
    # the label order (two samples of class 3) are left out.
    parts = ShardPartitioner(3, num_shards_per_partition=2).split(FOUR_BY_FIVE)
    assert [len(part) for part in parts] == [6, 6, 6]
    left_out = assert_disjoint_sorted(parts, 20, 3)
    assert FOUR_BY_FIVE[left_out].tolist() == [3, 3]


def test_dealt_shards_without_and_with_the_incomplete_one() -> None:
    # shard_size 3 cuts 20 samples into 6 complete shards and one of 2.
    dropped = ShardPartitioner(3, shard_size=3).split(FOUR_BY_FIVE)
    assert [len(part) for part in dropped] == [6, 6, 6]
    assert FOUR_BY_FIVE[assert_disjoint_sorted(dropped, 20, 3)].tolist() == [3, 3]
    kept = ShardPartitioner(3, shard_size=3, keep_incomplete_shard=True).split(FOUR_BY_FIVE)
    # 7 shards: partition 0 gets three, the others two; one of them is the short shard.
    assert sorted(len(part) for part in kept) in ([5, 6, 9], [6, 6, 8])
    assert len(assert_disjoint_sorted(kept, 20, 3)) == 0


def test_shard_sizes_match_the_flwr_datasets_mnist_examples() -> None:
    mnist_sized = np.repeat(np.arange(10), 6000)
    nine = ShardPartitioner(9, shard_size=1000).split(mnist_sized)
    assert [len(part) for part in nine] == [7000] * 6 + [6000] * 3
    ten = ShardPartitioner(10, shard_size=990, keep_incomplete_shard=True).split(mnist_sized)
    # 61 shards: one partition gets 7, and some partition the short one (600 samples).
    # flwr-datasets' docstring shows the outcome where they differ; they may coincide.
    assert sorted(len(part) for part in ten) in (
        [5550] + [5940] * 8 + [6930],
        [5940] * 9 + [6540],
    )


def test_mcmahan_split_gives_two_classes_at_most() -> None:
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 60))
    parts = ShardPartitioner(10, num_shards_per_partition=2, shard_size=30).split(labels)
    assert all(len(np.unique(labels[part])) <= 2 for part in parts)
    assert [len(part) for part in parts] == [60] * 10
    assert len(assert_disjoint_sorted(parts, 600, 10)) == 0


@given(
    labels=st.lists(st.integers(0, 5), min_size=1, max_size=200),
    num_partitions=st.integers(1, 10),
    per_partition=st.one_of(st.none(), st.integers(1, 4)),
    shard_size=st.one_of(st.none(), st.integers(1, 30)),
    keep=st.booleans(),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=200, deadline=None)
def test_shard_properties(
    labels: list[int],
    num_partitions: int,
    per_partition: int | None,
    shard_size: int | None,
    keep: bool,
    seed: int,
) -> None:
    if per_partition is None and shard_size is None:
        shard_size = 1
    keep = keep and per_partition is None
    y, n = np.asarray(labels), len(labels)
    partitioner = ShardPartitioner(
        num_partitions,
        num_shards_per_partition=per_partition,
        shard_size=shard_size,
        keep_incomplete_shard=keep,
        seed=seed,
    )
    # How many samples each argument combination must use, worked out from its rule.
    if per_partition is not None:
        wanted = num_partitions * per_partition
        size = shard_size if shard_size is not None else n // wanted
        possible = size > 0 and wanted * size <= n
        used = wanted * size
    else:
        assert shard_size is not None
        num_shards = n // shard_size + (keep and n % shard_size > 0)
        possible = num_shards >= num_partitions
        used = n if keep else n - n % shard_size
    if not possible:
        with pytest.raises(ValueError, match="shard"):
            partitioner.split(y)
        return
    parts = partitioner.split(y)
    left_out = assert_disjoint_sorted(parts, n, num_partitions)
    assert len(left_out) == n - used
    if per_partition is not None:
        assert {len(part) for part in parts} == {used // num_partitions}
    assert same_split(parts, partitioner.split(y.copy()))


def test_shard_seed_changes_the_split() -> None:
    labels = np.repeat(np.arange(10), 30)

    def split(seed: int) -> list[np.ndarray]:
        return ShardPartitioner(10, num_shards_per_partition=2, seed=seed).split(labels)

    assert same_split(split(3), split(3))
    assert not same_split(split(3), split(4))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "num_shards_per_partition, shard_size or both"),
        ({"shard_size": 0}, ValueError, "shard_size"),
        ({"shard_size": 2.5}, TypeError, "shard_size"),
        ({"num_shards_per_partition": 0}, ValueError, "num_shards_per_partition"),
        ({"num_shards_per_partition": True}, TypeError, "num_shards_per_partition"),
        ({"shard_size": 2, "keep_incomplete_shard": 1}, TypeError, "keep_incomplete_shard"),
        (
            {"num_shards_per_partition": 2, "keep_incomplete_shard": True},
            ValueError,
            "keep_incomplete_shard",
        ),
        ({"shard_size": 2, "num_partitions": 0}, ValueError, "num_partitions"),
    ],
)
def test_bad_shard_arguments_raise(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ShardPartitioner(**{"num_partitions": 3, **kwargs})


def test_shards_that_do_not_fit_raise() -> None:
    with pytest.raises(ValueError, match="needs 8 shards"):
        ShardPartitioner(4, num_shards_per_partition=2, shard_size=3).split(FOUR_BY_FIVE)
    with pytest.raises(ValueError, match="needs 30 shards"):
        ShardPartitioner(10, num_shards_per_partition=3).split(FOUR_BY_FIVE)
    with pytest.raises(ValueError, match="only 2 shards"):
        ShardPartitioner(3, shard_size=8).split(FOUR_BY_FIVE)


def test_shard_repr() -> None:
    assert repr(ShardPartitioner(100, num_shards_per_partition=2, shard_size=300)) == (
        "ShardPartitioner(num_partitions=100, num_shards_per_partition=2, shard_size=300, "
        "keep_incomplete_shard=False, seed=0)"
    )
