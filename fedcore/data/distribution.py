"""What a split looks like: class counts per partition, as a matrix or a text table.

The matrix is for code (plots, assertions); the table is for reading a split at a
glance before running an experiment on it, e.g. ``print(label_distribution_table(y,
parts))``. A table for 100,000 partitions would be unreadable, so by default it shows
the first and last rows and says how many it left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedcore.data import arguments


def label_distribution(labels: ArrayLike, partitions: Sequence[ArrayLike]) -> NDArray[np.int64]:
    """A (num_partitions, num_classes) count matrix; classes are the sorted unique labels."""
    classes, inverse = np.unique(arguments.label_array(labels), return_inverse=True)
    counts = np.zeros((len(partitions), len(classes)), dtype=np.int64)
    for row, part in enumerate(partitions):
        counts[row] = np.bincount(inverse[_index(part)], minlength=len(classes))
    return counts


def label_distribution_table(
    labels: ArrayLike, partitions: Sequence[ArrayLike], *, max_rows: int | None = 20
) -> str:
    """The class counts of each partition as an aligned text table, one row per partition.

    Columns: partition id, partition size, then one column per class (the sorted unique
    labels, including classes no partition holds). A ``total`` row sums every partition,
    shown or not. With more than ``max_rows`` partitions only the first
    ``max_rows - max_rows // 2`` and the last ``max_rows // 2`` are shown, around a
    ``...`` row; ``max_rows=None`` shows them all. Notes under the table say how many
    partitions were not shown and how many samples are in no partition (a pathological
    or shard split may leave some out).
    """
    if max_rows is not None:
        max_rows = arguments.count("max_rows", max_rows, minimum=1)
    array = arguments.label_array(labels)
    counts = label_distribution(array, partitions)
    sizes = counts.sum(axis=1)
    num_partitions = len(partitions)

    rows = [["partition", "size", *(str(label) for label in np.unique(array))]]
    shown = _shown_rows(num_partitions, max_rows)
    for pid in shown:
        if pid is None:
            rows.append(["...", "", *("" for _ in range(counts.shape[1]))])
        else:
            rows.append([str(pid), str(sizes[pid]), *(str(c) for c in counts[pid])])
    rows.append(["total", str(sizes.sum()), *(str(c) for c in counts.sum(axis=0))])

    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = [_line(row, widths) for row in rows]

    hidden = 0 if max_rows is None else max(num_partitions - max_rows, 0)
    if hidden:
        lines.append(f"({hidden} of {num_partitions} partitions not shown; max_rows={max_rows})")
    covered = np.zeros(len(array), dtype=bool)
    for part in partitions:
        covered[_index(part)] = True
    left_out = len(array) - int(covered.sum())
    if left_out:
        lines.append(f"({left_out} of {len(array)} samples are in no partition)")
    return "\n".join(lines)


def _index(part: ArrayLike) -> NDArray[Any]:
    """A partition as an index array; an empty list would otherwise become float64."""
    index = np.asarray(part)
    return index if index.size else index.astype(np.intp)


def _shown_rows(num_partitions: int, max_rows: int | None) -> list[int | None]:
    """The partition ids to show, in order, with ``None`` where rows are left out."""
    if max_rows is None or num_partitions <= max_rows:
        return list(range(num_partitions))
    tail = max_rows // 2
    return [*range(max_rows - tail), None, *range(num_partitions - tail, num_partitions)]


def _line(cells: list[str], widths: list[int]) -> str:
    """Right-aligned cells, with a bar between the (id, size) columns and the classes."""
    padded = [cell.rjust(width) for cell, width in zip(cells, widths, strict=True)]
    return (" ".join(padded[:2]) + " | " + " ".join(padded[2:])).rstrip()
