"""A hung ClientApp cannot hang a run: its round stops waiting after ``round_timeout``,
counts the missing reply as a failure (code 3), and the next round goes on."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import Run
from fedcore.domain.message import DEFAULT_TTL
from fedcore.strategy import FedAvg
from fedcore.strategy.rounds import DEFAULT_ROUND_TIMEOUT, round_limit
from fedcore.testing import FakeClock, round_reports

pytestmark = pytest.mark.anyio
ROUNDS = 2


def _app(handler: Callable[..., object], round_timeout: float | None) -> fc.App:
    client = fc.ClientApp()
    client.train()(handler)
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=3, round_timeout=round_timeout)
        await strategy.start(
            grid=grid, initial_arrays=fc.ArrayRecord({"w": np.zeros(2)}), num_rounds=ROUNDS
        )

    return fc.App(server=server, client=client)


def _reply(msg: fc.Message) -> fc.Message:
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(
        fc.RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg
    )


async def _run_with_one_hung_node(
    app: fc.App,
    hung: list[anyio.Event],
    wait: float,
    **options: object,
) -> None:
    """Run ``app`` on three nodes; each round, once node 0 hangs and the other two have
    replied, move time on by ``wait``."""
    clock = FakeClock()
    replies = _Replies()
    done = anyio.Event()

    async def simulate() -> None:
        await fc.simulate(app, nodes=3, backend="inline", seed=0, clock=clock, **options)
        done.set()

    logging.getLogger("fedcore.strategy").addHandler(replies)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(simulate)
            for index in range(ROUNDS):
                with anyio.fail_after(10):
                    await hung[index].wait()
                    await replies.rounds[index + 1].wait()
                clock.advance(wait)
            with anyio.fail_after(10):
                await done.wait()
    finally:
        logging.getLogger("fedcore.strategy").removeHandler(replies)


class _Replies(logging.Handler):
    """Sets ``rounds[r]`` once round ``r`` has two replies (the healthy nodes')."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.rounds: defaultdict[int, anyio.Event] = defaultdict(anyio.Event)

    def emit(self, record: logging.LogRecord) -> None:
        progress = getattr(record, "fedcore_reply", None)
        if progress is not None and progress.received == 2:
            self.rounds[progress.server_round].set()


def _entered(hung: list[anyio.Event]) -> None:
    next(event for event in hung if not event.is_set()).set()


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_hung_clientapp_fails_its_reply_and_the_run_goes_on(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    hung = [anyio.Event() for _ in range(ROUNDS)]
    release = threading.Event()
    token = None

    async def train_async(msg: fc.Message, context: fc.Context) -> fc.Message:
        if context.node_config["partition-id"] == 0:
            _entered(hung)
            await anyio.Event().wait()  # never set: hangs until cancelled
        return _reply(msg)

    def train_plain(msg: fc.Message, context: fc.Context) -> fc.Message:
        if context.node_config["partition-id"] == 0:
            anyio.from_thread.run_sync(_entered, hung, token=token)
            release.wait()  # blocks its thread until the test ends
        return _reply(msg)

    token = anyio.lowlevel.current_token()
    app = _app(train_async if kind == "async" else train_plain, round_timeout=30)
    try:
        with caplog.at_level(logging.DEBUG, logger="fedcore"):
            await _run_with_one_hung_node(app, hung, wait=30.5)
    finally:
        release.set()

    reports = round_reports(caplog.records)
    assert [report.server_round for report in reports] == [1, 2]
    for report in reports:
        assert report.train_replies == 2
        assert report.train_failures == {"code 3": 1}


async def test_the_run_wide_round_timeout_applies_when_the_strategy_has_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung = [anyio.Event() for _ in range(ROUNDS)]

    async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        if context.node_config["partition-id"] == 0:
            _entered(hung)
            await anyio.Event().wait()
        return _reply(msg)

    with caplog.at_level(logging.DEBUG, logger="fedcore"):
        await _run_with_one_hung_node(
            _app(train, round_timeout=None), hung, wait=5.5, round_timeout=5
        )

    reports = round_reports(caplog.records)
    assert [report.train_failures for report in reports] == [{"code 3": 1}] * ROUNDS


def test_the_strategy_s_own_round_timeout_wins_and_timeout_caps_both() -> None:
    class Grid:
        def __init__(self, run_wide: float | None) -> None:
            self.run = Run(1, round_timeout=run_wide)

    assert DEFAULT_ROUND_TIMEOUT < DEFAULT_TTL / 10
    assert round_limit(FedAvg(), Grid(None), 3600) == DEFAULT_ROUND_TIMEOUT  # type: ignore[arg-type]
    assert round_limit(FedAvg(), Grid(7), 3600) == 7  # type: ignore[arg-type]
    assert round_limit(FedAvg(round_timeout=3), Grid(7), 3600) == 3  # type: ignore[arg-type]
    assert round_limit(FedAvg(round_timeout=3), Grid(7), 2) == 2  # type: ignore[arg-type]
