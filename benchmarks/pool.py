"""The bare process-pool floor: a workload's ClientApp work through ``multiprocessing``.

A spawn-based ``multiprocessing.Pool`` with as many workers as the process backend
starts, fed over its pipes (arguments and results pickled): what the same work
costs with the plainest tool in the standard library, and no orchestration beyond
it.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.pool import Pool

from fedcore.simulation.resources import Resources
from fedcore.workers.sizing import plan_pool


def spawn_pool() -> Pool:
    """A spawn pool sized like the process backend with its default resources."""
    return multiprocessing.get_context("spawn").Pool(plan_pool(Resources()).workers)
