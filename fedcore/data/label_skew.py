"""Hard label skew: partitions that hold only a few classes each.

Dirichlet skew (:class:`~fedcore.data.DirichletPartitioner`) is soft: every partition may
see every class, just in skewed proportions. The two schemes here are the hard cases
from the literature, where a node never sees most classes at all:

- :class:`PathologicalPartitioner` gives each partition *exactly* k classes
  (Li et al., "Federated Learning on Non-IID Data Silos", 2021);
- :class:`ShardPartitioner` sorts the samples by label, cuts them into equal shards and
  deals a few shards to each partition (McMahan et al., "Communication-Efficient
  Learning of Deep Networks from Decentralized Data", 2017).

Both may leave samples out; each class's docstring says exactly which.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from fedcore.data import arguments
from fedcore.data.partitioners import IndexArray, Partitioner

ClassAssignmentMode = Literal["random", "deterministic", "first-deterministic"]


class PathologicalPartitioner(Partitioner):
    """Each partition holds samples of exactly ``num_classes_per_partition`` classes.

    Classes are the sorted unique labels, numbered ``0 .. C-1``. First each partition is
    assigned its k classes, by ``class_assignment_mode`` (as in flwr-datasets):

    - ``"random"``: k classes drawn uniformly without replacement, independently for
      each partition;
    - ``"deterministic"``: partition p gets classes ``(p + i) % C`` for ``i < k``, so
      partition 0 holds 0..k-1, partition 1 holds 1..k, and so on;
    - ``"first-deterministic"``: the first class is ``p % C`` and the other k-1 are drawn
      at random from the rest. With at least C partitions every class is used; this is
      the setting of the paper.

    Then each class's samples are shuffled and divided as evenly as possible (sizes
    differ by at most one) among the partitions holding that class. A class that no
    partition holds is left out, samples and all, with a ``UserWarning`` naming it;
    ``"deterministic"`` and ``"first-deterministic"`` use every class once
    ``num_partitions >= C``. It is a ``ValueError`` if k exceeds the number of classes,
    or if a class is held by more partitions than it has samples, since some partition
    would then miss one of its k classes.

    The seed drives both the random class assignment and the shuffle within classes, so
    even ``"deterministic"`` mode gives a different split for a different seed.
    """

    def __init__(
        self,
        num_partitions: int,
        *,
        num_classes_per_partition: int,
        class_assignment_mode: ClassAssignmentMode = "random",
        seed: int = 0,
    ) -> None:
        super().__init__(num_partitions, seed=seed)
        self._num_classes_per_partition = arguments.count(
            "num_classes_per_partition", num_classes_per_partition, minimum=1
        )
        modes = get_args(ClassAssignmentMode)
        if not isinstance(class_assignment_mode, str):
            raise TypeError(
                f"class_assignment_mode must be a str, got {type(class_assignment_mode).__name__}"
            )
        if class_assignment_mode not in modes:
            raise ValueError(
                f"class_assignment_mode must be one of {', '.join(map(repr, modes))}, "
                f"got {class_assignment_mode!r}"
            )
        self._class_assignment_mode: ClassAssignmentMode = class_assignment_mode

    @property
    def num_classes_per_partition(self) -> int:
        return self._num_classes_per_partition

    @property
    def class_assignment_mode(self) -> ClassAssignmentMode:
        return self._class_assignment_mode

    def _params(self) -> dict[str, object]:
        return {
            "num_partitions": self._num_partitions,
            "num_classes_per_partition": self._num_classes_per_partition,
            "class_assignment_mode": self._class_assignment_mode,
            "seed": self._seed,
        }

    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        classes, inverse, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)
        k = self._num_classes_per_partition
        if k > len(classes):
            raise ValueError(
                f"num_classes_per_partition={k} exceeds the {len(classes)} classes in the labels"
            )
        rng = np.random.default_rng(self._seed)
        held = self._assign_classes(len(classes), rng).ravel()
        holders_per_class = np.bincount(held, minlength=len(classes))
        crowded = np.flatnonzero(holders_per_class > class_sizes)
        if len(crowded):
            c = crowded[0]
            raise ValueError(
                f"class {classes[c].item()!r} has {class_sizes[c]} samples but "
                f"{holders_per_class[c]} partitions hold it under {self!r}; use fewer "
                "partitions, fewer classes per partition, or "
                "class_assignment_mode='deterministic', which spreads classes evenly"
            )

        # Partition ids grouped by the class they hold, ascending within each class.
        holder_ids = np.repeat(np.arange(self._num_partitions), k)[np.argsort(held, kind="stable")]
        holders_by_class = np.split(holder_ids, np.cumsum(holders_per_class)[:-1])
        members_by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(class_sizes)[:-1])
        owner = np.full(len(labels), -1, dtype=np.int64)
        for members, holders in zip(members_by_class, holders_by_class, strict=True):
            if len(holders):
                # As even as can be: the first len(members) % len(holders) get one more.
                least, extra = divmod(len(members), len(holders))
                shares = least + (np.arange(len(holders)) < extra)
                owner[rng.permutation(members)] = np.repeat(holders, shares)

        unused = classes[holders_per_class == 0]
        if len(unused):
            warnings.warn(
                f"{self!r} assigns no partition to classes {unused.tolist()}; their "
                f"{int(class_sizes[holders_per_class == 0].sum())} samples are left out",
                UserWarning,
                stacklevel=4,
            )
        return self._parts_from_owners(owner)

    def _assign_classes(self, num_classes: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """A (num_partitions, k) array: the class numbers each partition holds."""
        parts, k = self._num_partitions, self._num_classes_per_partition
        first = np.arange(parts, dtype=np.int64) % num_classes
        if self._class_assignment_mode == "deterministic":
            return (first[:, None] + np.arange(k)) % num_classes
        if self._class_assignment_mode == "random":
            return _random_subsets(rng, parts, num_classes, k)
        # k-1 of the other C-1 classes: draw from 0..C-2, then step over the first class.
        others = _random_subsets(rng, parts, num_classes - 1, k - 1)
        others += others >= first[:, None]
        return np.column_stack([first, others])


def _random_subsets(
    rng: np.random.Generator, rows: int, population: int, size: int
) -> NDArray[np.int64]:
    """``rows`` independent uniform ``size``-subsets of ``range(population)``, one per row.

    Robert Floyd's algorithm, vectorised over rows: step j draws t from ``0..j`` and takes
    t, or j itself if t is already taken. It needs O(rows × size) memory, not the
    O(rows × population) of ranking random keys, which matters for 100,000 partitions
    of a 1,000-class dataset.
    """
    chosen = np.empty((rows, size), dtype=np.int64)
    for step, j in enumerate(range(population - size, population)):
        t = rng.integers(0, j + 1, size=rows)
        taken = (chosen[:, :step] == t[:, None]).any(axis=1)
        chosen[:, step] = np.where(taken, j, t)
    return chosen


class ShardPartitioner(Partitioner):
    """Samples sorted by label, cut into shards of ``shard_size``, shards dealt at random.

    Sorting is by label with ties in a random (seeded) order, so a shard is a random
    sample of one class, or of two neighbouring classes where it straddles a boundary.
    Shards are consecutive runs of the sorted order; the last one is *incomplete* when
    ``shard_size`` does not divide the number of samples ``n``. The argument
    combinations follow flwr-datasets:

    - ``num_shards_per_partition`` and ``shard_size``: every partition gets exactly that
      many shards of exactly that size, drawn at random from the ``n // shard_size``
      complete shards. Samples in undrawn shards are left out. ``ValueError`` if
      ``num_partitions × num_shards_per_partition × shard_size > n``. McMahan et al.'s
      MNIST split is ``ShardPartitioner(100, num_shards_per_partition=2, shard_size=300)``.
    - ``num_shards_per_partition`` only: as above with
      ``shard_size = n // (num_partitions × num_shards_per_partition)``; the
      ``n % (num_partitions × num_shards_per_partition)`` samples that do not fit, those
      of the incomplete shard and of any complete shard not drawn, are left out.
    - ``shard_size`` only: every complete shard is used, and with
      ``keep_incomplete_shard=True`` the incomplete one too (otherwise its samples, the
      last in label order, are left out). Shards are shuffled and dealt so that the
      first ``num_shards % num_partitions`` partitions get one more than the others.
      ``ValueError`` if there are fewer shards than partitions.

    ``keep_incomplete_shard=True`` together with ``num_shards_per_partition`` is a
    ``ValueError``: there every partition gets equal, complete shards. (flwr-datasets
    accepts it, and when the shard size is derived makes the incomplete shard one of the
    candidates; here that combination is refused rather than half-honoured.)
    """

    def __init__(
        self,
        num_partitions: int,
        *,
        num_shards_per_partition: int | None = None,
        shard_size: int | None = None,
        keep_incomplete_shard: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(num_partitions, seed=seed)
        if num_shards_per_partition is None and shard_size is None:
            raise ValueError("give num_shards_per_partition, shard_size or both; got neither")
        self._num_shards_per_partition = (
            None
            if num_shards_per_partition is None
            else arguments.count("num_shards_per_partition", num_shards_per_partition, minimum=1)
        )
        self._shard_size = (
            None if shard_size is None else arguments.count("shard_size", shard_size, minimum=1)
        )
        self._keep_incomplete_shard = arguments.flag("keep_incomplete_shard", keep_incomplete_shard)
        if self._keep_incomplete_shard and self._num_shards_per_partition is not None:
            raise ValueError(
                "keep_incomplete_shard=True applies only when num_shards_per_partition is "
                "None; with num_shards_per_partition every partition gets complete shards"
            )

    @property
    def num_shards_per_partition(self) -> int | None:
        return self._num_shards_per_partition

    @property
    def shard_size(self) -> int | None:
        return self._shard_size

    @property
    def keep_incomplete_shard(self) -> bool:
        return self._keep_incomplete_shard

    def _params(self) -> dict[str, object]:
        return {
            "num_partitions": self._num_partitions,
            "num_shards_per_partition": self._num_shards_per_partition,
            "shard_size": self._shard_size,
            "keep_incomplete_shard": self._keep_incomplete_shard,
            "seed": self._seed,
        }

    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        n, parts = len(labels), self._num_partitions
        rng = np.random.default_rng(self._seed)
        _, inverse = np.unique(labels, return_inverse=True)
        shuffled = rng.permutation(n)
        by_label = shuffled[np.argsort(inverse[shuffled], kind="stable")]

        per_partition = self._num_shards_per_partition
        if per_partition is not None:
            wanted = parts * per_partition
            size = self._shard_size if self._shard_size is not None else n // wanted
            if size == 0 or wanted * size > n:
                raise ValueError(
                    f"{self!r} needs {wanted} shards of at least one sample "
                    f"(shard_size={size}) but there are only {n} samples"
                )
            drawn = rng.permutation(n // size)[:wanted]
            shard_owner = np.full(-(-n // size), -1, dtype=np.int64)
            shard_owner[drawn] = np.repeat(np.arange(parts), per_partition)
        else:
            assert self._shard_size is not None  # the constructor refused neither
            size = self._shard_size
            num_shards = n // size + (self._keep_incomplete_shard and n % size > 0)
            if num_shards < parts:
                raise ValueError(
                    f"{self!r} cuts {n} samples into only {num_shards} shards, fewer than "
                    "the partitions; use a smaller shard_size or fewer partitions"
                )
            counts = np.full(parts, num_shards // parts) + (np.arange(parts) < num_shards % parts)
            shard_owner = np.full(-(-n // size), -1, dtype=np.int64)
            shard_owner[rng.permutation(num_shards)] = np.repeat(np.arange(parts), counts)

        owner = np.empty(n, dtype=np.int64)
        owner[by_label] = shard_owner[np.arange(n) // size]
        return self._parts_from_owners(owner)
