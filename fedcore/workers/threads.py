"""Thread caps: a ClientApp process runs no more compute threads than it has CPUs.

numpy's BLAS (OpenBLAS, MKL), OpenMP and torch each start, by default, a thread per
core of the machine — in every process. Two workers on two cores then run four or
more threads that take turns on those cores, and a PyTorch ClientApp trains several
times slower than with one thread each. So every ClientApp process (a simulation's
workers, a node's ClientApp processes) starts with ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to its share of CPUs, rounded up
to a whole thread: ``num_cpus=0.5`` gives 1, ``2`` gives 2. torch sizes its intra-op
pool from ``OMP_NUM_THREADS`` when it loads, so it follows the same cap.

The libraries read these variables once, as they load, which happens in the child
before any of fedcore's code could act: the cap has to be in the child's environment
from the start. It is a default, not an override: a variable the user set in the
environment the process inherits is kept, each variable on its own.
"""

from __future__ import annotations

import math
from fractions import Fraction

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""The variables that size the thread pools of OpenMP, MKL and OpenBLAS."""


def thread_count(num_cpus: float) -> int:
    """Threads for a process with ``num_cpus`` CPUs: rounded up, at least 1.

    In decimal, so that a share written ``2.0`` or ``0.3 * 10`` is not taken for a
    hair more than it is and given a thread too many.
    """
    return max(1, math.ceil(Fraction(str(num_cpus)).limit_denominator(10**9)))


def thread_defaults(threads: int) -> dict[str, str]:
    """The environment defaults that cap a process's thread pools at ``threads``."""
    return {variable: str(threads) for variable in THREAD_VARIABLES}
