"""A round holds one model's worth of replies, not one per reply (issue: memory O(model))."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from pool_apps import client

import fedcore as fc
from fedcore.strategy import FedAvg, Result

pytestmark = pytest.mark.anyio

PAGE = os.sysconf("SC_PAGE_SIZE")
MODEL_BYTES = 4 * 2**20
REPLIES = 200


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


@contextmanager
def _peak_rss_growth() -> Iterator[list[int]]:
    baseline, peak = _rss(), [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss() - baseline)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


async def test_replies_are_folded_in_and_released_as_they_arrive() -> None:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        model = fc.ArrayRecord({"w": np.ones(MODEL_BYTES // 4, np.float32)})
        strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=REPLIES)
        return await strategy.start(grid=grid, initial_arrays=model, num_rounds=1)

    app = fc.App(server=server, client=client)
    with _peak_rss_growth() as peak:
        result = await fc.simulate(app, nodes=REPLIES, max_workers=2, seed=0)
    value: Result = result.value
    assert (value.arrays["w"] == 1).all()
    held_together = peak[0] / MODEL_BYTES
    assert held_together < 30, f"{held_together:.0f} models' worth of replies were resident at once"
