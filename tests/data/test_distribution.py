"""The label distribution table: layout, elided rows, notes, argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.data import label_distribution, label_distribution_table

LABELS = np.array([3, 1, 3, 3, 7, 1])
PARTS = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5])]


def test_table_by_hand() -> None:
    assert label_distribution_table(LABELS, PARTS) == (
        "partition size | 1 3 7\n"
        "        0    2 | 1 1 0\n"
        "        1    3 | 0 2 1\n"
        "        2    1 | 1 0 0\n"
        "    total    6 | 2 3 1"
    )


def test_columns_widen_for_long_labels_and_counts() -> None:
    labels = np.array(["cat"] * 12 + ["hippopotamus"])
    assert label_distribution_table(labels, [np.arange(13)]) == (
        "partition size | cat hippopotamus\n"
        "        0   13 |  12            1\n"
        "    total   13 |  12            1"
    )


def test_many_partitions_are_elided_around_a_gap() -> None:
    labels = np.arange(7) % 2
    parts = [np.array([i]) for i in range(7)]
    lines = label_distribution_table(labels, parts, max_rows=4).splitlines()
    assert [line.split()[0] for line in lines] == [
        "partition",
        "0",
        "1",
        "...",
        "5",
        "6",
        "total",
        "(3",
    ]
    assert lines[-2] == "    total    7 | 4 3"  # counts every partition, shown or not
    assert lines[-1] == "(3 of 7 partitions not shown; max_rows=4)"
    odd = label_distribution_table(labels, parts, max_rows=3).splitlines()
    assert [line.split()[0] for line in odd[1:5]] == ["0", "1", "...", "6"]
    assert len(label_distribution_table(labels, parts, max_rows=None).splitlines()) == 9
    assert len(label_distribution_table(labels, parts, max_rows=7).splitlines()) == 9


def test_left_out_samples_are_noted() -> None:
    table = label_distribution_table(LABELS, [np.array([0, 4]), np.array([], dtype=np.int64)])
    assert table.splitlines() == [
        "partition size | 1 3 7",
        "        0    2 | 0 1 1",
        "        1    0 | 0 0 0",
        "    total    2 | 0 1 1",
        "(4 of 6 samples are in no partition)",
    ]


def test_empty_lists_count_as_empty_partitions() -> None:
    assert label_distribution(LABELS, [[], [1, 5]]).tolist() == [[0, 0, 0], [2, 0, 0]]


@pytest.mark.parametrize(("max_rows", "error"), [(0, ValueError), (2.0, TypeError)])
def test_bad_max_rows_raise(max_rows: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_rows"):
        label_distribution_table(LABELS, PARTS, max_rows=max_rows)  # type: ignore[arg-type]
