"""Quantity skew: partitions of unequal size, each with an IID label mix.

Real federations are unbalanced: a few nodes hold most of the data. These partitioners
isolate that one effect: the samples are shuffled (seeded) and cut into consecutive
runs whose sizes follow a fixed law of the partition id (:class:`LinearPartitioner`
∝ ``i + 1``, :class:`ExponentialPartitioner` ∝ ``base ** i``,
:class:`PowerLawPartitioner` ∝ ``(num_partitions - i) ** -exponent``), so partition 0
is the smallest and the last the largest, as in flwr-datasets. Sizes are deterministic
(largest-remainder rounding, ties to the larger id: each within one sample of its exact
share, never decreasing with the id); every sample is used, and a law too steep for
the number of samples, leaving a partition empty, is a ``ValueError``.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedcore.data import arguments
from fedcore.data.partitioners import IndexArray, Partitioner


class SizeSkewPartitioner(Partitioner):
    """Shuffle, then cut into runs whose sizes follow :meth:`_weights`."""

    _milder = ""
    """How to make the law less steep, for the error message when a partition gets none."""

    def partition_sizes(self, num_samples: int) -> NDArray[np.int64]:
        """The size of each partition for ``num_samples`` samples (they sum to it)."""
        n = arguments.count("num_samples", num_samples, minimum=0)
        weights = self._weights()
        shares: NDArray[np.float64] = n * (weights / weights.sum())
        sizes: NDArray[np.int64] = np.floor(shares).astype(np.int64)
        # Largest remainder: order by fractional part, then by id, both descending.
        ids = np.arange(self._num_partitions)
        leftover = np.lexsort((-ids, -(shares - sizes)))[: n - int(sizes.sum())]
        sizes[leftover] += 1
        if sizes[0] < 1:
            raise ValueError(
                f"{self!r} gives partition 0 a share of {shares[0]:.3g} of {n} samples, which "
                "rounds to none; every partition needs at least one sample: use more samples, "
                f"fewer partitions{self._milder}"
            )
        return sizes

    def _split(self, labels: NDArray[Any]) -> list[IndexArray]:
        sizes = self.partition_sizes(len(labels))
        order = np.random.default_rng(self._seed).permutation(len(labels)).astype(np.int64)
        return [np.sort(run) for run in np.split(order, np.cumsum(sizes)[:-1])]

    @abstractmethod
    def _weights(self) -> NDArray[np.float64]:
        """Positive, non-decreasing relative sizes, one per partition; the largest is 1.

        Scaling so that the largest is 1 keeps steep laws from overflowing: the smallest
        weights underflow to 0 instead, which the size check reports.
        """


class LinearPartitioner(SizeSkewPartitioner):
    """Partition i gets a share ∝ ``i + 1``: the last partition holds N times the first."""

    def _params(self) -> dict[str, object]:
        return {"num_partitions": self._num_partitions, "seed": self._seed}

    def _weights(self) -> NDArray[np.float64]:
        return np.arange(1, self._num_partitions + 1) / self._num_partitions


class ExponentialPartitioner(SizeSkewPartitioner):
    """Partition i gets a share ∝ ``base ** i``; each partition ``base`` times the previous.

    The default ``base`` is e, as in flwr-datasets (where sizes ∝ ``e ** (i + 1)``, the
    same shares). That is steep: the last partition holds ``e ** (N - 1)`` times the
    first, so with 60,000 samples more than 11 partitions leave partition 0 with none and
    the split raises. For many partitions pick a base close to 1: ``base=1.05`` spreads
    100 partitions 125-fold.
    """

    _milder = " or a base closer to 1"

    def __init__(self, num_partitions: int, *, base: float = math.e, seed: int = 0) -> None:
        super().__init__(num_partitions, seed=seed)
        self._base = arguments.number_above("base", base, 1)

    @property
    def base(self) -> float:
        return self._base

    def _params(self) -> dict[str, object]:
        return {"num_partitions": self._num_partitions, "base": self._base, "seed": self._seed}

    def _weights(self) -> NDArray[np.float64]:
        # base ** (i - N + 1) as a running product of 1/base from the top: each step can
        # only shrink the weight, so rounding never breaks the order.
        weights = np.ones(self._num_partitions)
        weights[:-1] = np.cumprod(np.full(self._num_partitions - 1, 1 / self._base))[::-1]
        return weights


class PowerLawPartitioner(SizeSkewPartitioner):
    """Partition i gets a share ∝ ``r ** -exponent`` with rank ``r = num_partitions - i``.

    The rank-size (Zipf) law: the largest partition (the last) has rank 1, the next
    holds ``2 ** -exponent`` as much, and so on down to partition 0. A few partitions hold
    most of the data: with the default ``exponent=1.0`` the largest 10 of 100 partitions
    hold 56 % of the samples. Larger exponents are steeper.
    """

    _milder = " or a smaller exponent"

    def __init__(self, num_partitions: int, *, exponent: float = 1.0, seed: int = 0) -> None:
        super().__init__(num_partitions, seed=seed)
        self._exponent = arguments.number_above("exponent", exponent, 0)

    @property
    def exponent(self) -> float:
        return self._exponent

    def _params(self) -> dict[str, object]:
        return {
            "num_partitions": self._num_partitions,
            "exponent": self._exponent,
            "seed": self._seed,
        }

    def _weights(self) -> NDArray[np.float64]:
        ranks = np.arange(self._num_partitions, 0, -1, dtype=np.float64)
        return ranks**-self._exponent
