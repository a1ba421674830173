"""Partitioners: split one dataset's sample indices among simulated nodes.

A simulation runs many nodes against a single in-memory dataset, so each node needs its
own slice of it. How the slices are drawn decides the experiment: an IID split gives
every node the same label mix, a Dirichlet split skews each node towards a few labels,
which is the non-IID setting federated algorithms are meant to cope with. Every
partitioner is deterministic given a seed (numpy ``Generator`` seeded from a
``SeedSequence``, never the global RNG), so a run is reproducible across processes and
machines with the same numpy.

Partitioners work on labels only and return sample *indices*; turning indices into
features and targets is left to the caller. This module holds the base class and the
two general-purpose splits; :mod:`fedcore.data.label_skew` and
:mod:`fedcore.data.size_skew` hold the more specialised ones.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedcore.data import arguments

IndexArray = NDArray[np.int64]


class Partitioner(ABC):
    """Splits ``range(len(labels))`` into ``num_partitions`` disjoint, sorted index arrays.

    Every index lands in exactly one partition, except under the pathological and shard
    partitioners, whose docstrings say which samples they leave out and why.
    """

    def __init__(self, num_partitions: int, *, seed: int = 0) -> None:
        self._num_partitions = arguments.count("num_partitions", num_partitions, minimum=1)
        self._seed = arguments.count("seed", seed, minimum=0)
        self._memo: tuple[tuple[object, ...], list[IndexArray]] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def seed(self) -> int:
        return self._seed

    def split(self, labels: ArrayLike) -> list[IndexArray]:
        """One int64 index array per partition, each sorted, no index in two of them."""
        return [part.copy() for part in self._cached_split(arguments.label_array(labels))]

    def partition(self, labels: ArrayLike, partition_id: int) -> IndexArray:
        """The indices of one partition; the full split is memoised for the last labels."""
        pid = arguments.count("partition_id", partition_id, minimum=0)
        if pid >= self._num_partitions:
            raise ValueError(
                f"partition_id must be in [0, {self._num_partitions}), got {partition_id}"
            )
        return self._cached_split(arguments.label_array(labels))[pid].copy()

    def _cached_split(self, labels: NDArray[Any]) -> list[IndexArray]:
        # Keyed by content, not identity, so labels mutated in place are split afresh.
        digest = hashlib.sha256(labels.tobytes()).digest()
        key = (labels.dtype.str, labels.shape, digest, *self._params().values())
        if self._memo is None or self._memo[0] != key:
            self._memo = (key, self._split(labels))
        return self._memo[1]

    @abstractmethod
    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        """Split validated 1-d labels; the result is owned by the memo and never mutated."""

    def _parts_from_owners(self, owner: NDArray[np.int64]) -> list[IndexArray]:
        """Group sample indices by the partition that owns them; ``-1`` marks left-out samples.

        A stable sort by owner keeps each partition's indices ascending.
        """
        kept = np.flatnonzero(owner >= 0)
        kept_owner = owner[kept]
        sizes = np.bincount(kept_owner, minlength=self._num_partitions)
        order = kept[np.argsort(kept_owner, kind="stable")].astype(np.int64)
        return np.split(order, np.cumsum(sizes)[:-1])

    @abstractmethod
    def _params(self) -> dict[str, object]:
        """Constructor arguments, in order, for ``repr`` and the memo key."""

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={value!r}" for name, value in self._params().items())
        return f"{type(self).__name__}({args})"


class IidPartitioner(Partitioner):
    """A random permutation cut into near-equal parts (sizes differ by at most 1)."""

    def _params(self) -> dict[str, object]:
        return {"num_partitions": self._num_partitions, "seed": self._seed}

    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        order = np.random.default_rng(self._seed).permutation(len(labels))
        return [
            np.sort(part).astype(np.int64) for part in np.array_split(order, self._num_partitions)
        ]


class DirichletPartitioner(Partitioner):
    """Label skew: each class is shared out by proportions drawn from Dirichlet(alpha).

    Small ``alpha`` (e.g. 0.1) concentrates each class on a few partitions; large
    ``alpha`` (e.g. 1000) approaches an IID split. If a draw leaves some partition with
    fewer than ``min_partition_size`` samples it is redrawn, up to ``max_attempts`` times;
    attempt ``k`` uses ``np.random.default_rng([seed, k])``.
    """

    def __init__(
        self,
        num_partitions: int,
        *,
        alpha: float,
        seed: int = 0,
        min_partition_size: int = 0,
        max_attempts: int = 10,
    ) -> None:
        super().__init__(num_partitions, seed=seed)
        self._alpha = arguments.number_above("alpha", alpha, 0)
        self._min_partition_size = arguments.count(
            "min_partition_size", min_partition_size, minimum=0
        )
        self._max_attempts = arguments.count("max_attempts", max_attempts, minimum=1)

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def min_partition_size(self) -> int:
        return self._min_partition_size

    @property
    def max_attempts(self) -> int:
        return self._max_attempts

    def _params(self) -> dict[str, object]:
        return {
            "num_partitions": self._num_partitions,
            "alpha": self._alpha,
            "seed": self._seed,
            "min_partition_size": self._min_partition_size,
            "max_attempts": self._max_attempts,
        }

    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        n, parts, least = len(labels), self._num_partitions, self._min_partition_size
        if parts * least > n:
            raise ValueError(
                f"cannot give {parts} partitions at least {least} samples each from only "
                f"{n} samples; use fewer partitions or a smaller min_partition_size"
            )
        _, inverse, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)
        by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(class_sizes)[:-1])
        smallest = 0
        for attempt in range(self._max_attempts):
            owner = self._draw_owners(by_class, n, np.random.default_rng([self._seed, attempt]))
            smallest = int(np.bincount(owner, minlength=parts).min())
            if smallest >= least:
                return self._parts_from_owners(owner)
        raise ValueError(
            f"{self!r} could not give every partition at least {least} samples in "
            f"{self._max_attempts} attempts (the last draw's smallest partition had {smallest}); "
            "use fewer partitions, a larger alpha, a smaller min_partition_size "
            "or more max_attempts"
        )

    def _draw_owners(
        self, by_class: list[NDArray[np.intp]], n: int, rng: np.random.Generator
    ) -> IndexArray:
        """The partition each of ``n`` samples goes to, for one draw of class proportions."""
        parts = self._num_partitions
        owner = np.empty(n, dtype=np.int64)
        for class_members in by_class:
            members = rng.permutation(class_members)
            proportions = rng.dirichlet(np.full(parts, self._alpha))
            # Cumulative proportions -> split points (the last pinned against rounding);
            # shuffled position j goes to the first partition whose split point exceeds j.
            cuts = np.cumsum(proportions) * len(members)
            cuts[-1] = len(members)
            owner[members] = np.searchsorted(cuts, np.arange(len(members)), side="right")
        return owner
