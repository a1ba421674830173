"""100,000 registered nodes: cheap to hold when only a few are used (a soak: `make test-all`)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from pool_apps import client

import fedcore as fc
from fedcore.strategy import FedAvg, Result

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


async def test_a_hundred_thousand_nodes_cost_little_memory() -> None:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> tuple[int, Result]:
        strategy = FedAvg(fraction_train=10 / 100_000, fraction_evaluate=0.0)
        model = fc.ArrayRecord({"w": np.ones(16, np.float32)})
        result = await strategy.start(grid=grid, initial_arrays=model, num_rounds=3)
        return _rss(), result

    before = _rss()
    peak, result = (
        await fc.simulate(fc.App(server=server, client=client), nodes=100_000, seed=0)
    ).value
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert (peak - before) / 2**20 < 200, "more than 2 KiB per registered node"
