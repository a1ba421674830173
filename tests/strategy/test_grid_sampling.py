"""Configure methods given a Grid, as Flower passes one: sampling through it, bounded waits.

The round driver passes node ids it shuffled with the run's seed; Flower-style code
passes the Grid. Given a Grid, a strategy must pick the very nodes the driver would
have passed, wait at most ``start``'s default timeout for enough of them, and refuse
to block the event loop.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, Message
from fedcore.apps.grid import SyncGrid
from fedcore.errors import NotEnoughNodesError
from fedcore.strategy import (
    Bulyan,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedBuff,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    QFedAvg,
    Strategy,
)
from fedcore.strategy.rounds import shuffled
from fedcore.testing import FakeClock

ARRAYS = ArrayRecord({"w": np.zeros(3)})
SEED = 5
NODES = 8


def _targets(messages: list[Message]) -> list[int]:
    return [message.metadata.dst_node_id for message in messages]


async def _serve(main: Any, *, nodes: int = NODES, **options: Any) -> Any:
    """Run ``main`` (a plain or async ServerApp main) on ``nodes`` nodes; what it returned."""
    server = fc.ServerApp()
    server.main()(main)
    app = fc.App(server=server, client=fc.ClientApp())
    return (await fc.simulate(app, nodes=nodes, seed=SEED, backend="inline", **options)).value


@pytest.mark.anyio
async def test_a_grid_gets_the_nodes_the_driver_would_pass() -> None:
    strategy = FedAvg(fraction_train=0.5, fraction_evaluate=0.25, min_available_nodes=6)

    def main(grid: SyncGrid, context: fc.Context) -> tuple[list[Message], list[Message], list[int]]:
        train = strategy.configure_train(3, ARRAYS, ConfigRecord({"lr": 0.1}), grid)
        evaluate = strategy.configure_evaluate(3, ARRAYS, ConfigRecord(), grid)
        return train, evaluate, grid.get_node_ids()

    train, evaluate, online = await _serve(main)

    assert len(online) == NODES
    assert _targets(train) == shuffled(online, SEED, 3, "train")[:4]  # 8 × 0.5
    assert _targets(evaluate) == shuffled(online, SEED, 3, "evaluate")[:2]  # max(8 × 0.25, 2)
    pure = strategy.configure_train(
        3, ARRAYS, ConfigRecord({"lr": 0.1}), shuffled(online, SEED, 3, "train")
    )
    assert _targets(train) == _targets(pure)
    assert [m.content["config"]["server-round"] for m in train] == [3] * 4
    assert {m.metadata.message_type for m in train} == {"train"}
    assert {m.metadata.message_type for m in evaluate} == {"evaluate"}


@pytest.mark.anyio
async def test_a_wrapper_hands_the_grid_to_the_strategy_it_wraps() -> None:
    inner = FedAvg(fraction_train=0.25, min_train_nodes=1)
    wrappers = [
        DifferentialPrivacyServerSideFixedClipping(inner, 0.0, 1.0, 2),
        DifferentialPrivacyClientSideFixedClipping(inner, 0.0, 1.0, 2),
    ]

    def main(grid: SyncGrid, context: fc.Context) -> tuple[list[list[Message]], list[int]]:
        configured = [w.configure_train(1, ARRAYS, ConfigRecord(), grid) for w in wrappers]
        return configured, grid.get_node_ids()

    (server_side, client_side), online = await _serve(main)

    assert _targets(server_side) == _targets(client_side) == shuffled(online, SEED, 1, "train")[:2]
    assert client_side[0].content["config"]["clipping_norm"] == 1.0


@pytest.mark.anyio
async def test_an_async_grid_is_sampled_from_a_worker_thread() -> None:
    strategy = FedAvg(fraction_train=0.5)

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[list[Message], list[int]]:
        messages = await anyio.to_thread.run_sync(
            strategy.configure_train, 2, ARRAYS, ConfigRecord(), grid
        )
        return messages, await grid.get_node_ids()

    messages, online = await _serve(main)

    assert _targets(messages) == shuffled(online, SEED, 2, "train")[:4]


@pytest.mark.anyio
async def test_an_async_grid_in_the_event_loop_is_refused() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        FedAvg().configure_evaluate(1, ARRAYS, ConfigRecord(), grid)

    with pytest.raises(TypeError, match=r"FedAvg\.configure_evaluate was given an async Grid"):
        await _serve(main)


@pytest.mark.anyio
async def test_waiting_for_nodes_through_a_grid_times_out_as_start_does(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Exception] = []

    def main(grid: SyncGrid, context: fc.Context) -> None:
        FedAvg(min_available_nodes=5).configure_train(1, ARRAYS, ConfigRecord(), grid)

    async def simulate() -> None:
        try:
            await _serve(main, nodes=3, clock=fake_clock)
        except NotEnoughNodesError as exc:
            errors.append(exc)

    waiting = anyio.Event()

    class Waiting(logging.Handler):
        """The grid logs that it waits on the event loop, then arms its deadline."""

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for nodes"):
                waiting.set()

    handler = Waiting()
    logging.getLogger("fedcore").addHandler(handler)
    caplog.set_level(logging.INFO, logger="fedcore")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(simulate)
            with anyio.fail_after(10):
                await waiting.wait()
            await _expire(fake_clock, errors)
    finally:
        logging.getLogger("fedcore").removeHandler(handler)
    assert [str(e) for e in errors] == ["waited 3600 s for 5 nodes; only 3 came online"]


async def _expire(fake_clock: FakeClock, errors: list[Exception]) -> None:
    """Nothing is raised a second before the default timeout; at it, the error."""
    await anyio.wait_all_tasks_blocked()
    fake_clock.advance(3599)
    await anyio.wait_all_tasks_blocked()
    assert not errors
    fake_clock.advance(1)


def test_fraction_zero_asks_a_grid_for_nothing() -> None:
    class NoGrid(SyncGrid):
        def wait_for_nodes(self, count: int, *, timeout: float | None = None) -> list[int]:
            raise AssertionError("a phase that samples no one must not wait for nodes")

    grid = NoGrid.__new__(NoGrid)
    assert FedAvg(fraction_evaluate=0.0).configure_evaluate(1, ARRAYS, ConfigRecord(), grid) == []


@pytest.mark.parametrize("nodes", ["12", object(), 3])
def test_neither_ids_nor_a_grid_is_refused(nodes: Any) -> None:
    with pytest.raises(TypeError, match=r"FedAvg\.configure_train takes node ids or a Grid"):
        FedAvg().configure_train(1, ARRAYS, ConfigRecord(), nodes)


# ------------------------------------------------------------------ summary()


def _every_strategy() -> list[Strategy]:
    return [
        Bulyan(num_malicious_nodes=0),
        DifferentialPrivacyClientSideFixedClipping(FedAvg(), 1.0, 2.0, 10),
        DifferentialPrivacyServerSideFixedClipping(FedAvg(), 1.0, 2.0, 10),
        FedAdagrad(),
        FedAdam(),
        FedAvg(),
        FedAvgM(),
        FedBuff(),
        FedMedian(),
        FedProx(proximal_mu=0.1),
        FedTrimmedAvg(),
        FedYogi(),
        Krum(),
        MultiKrum(),
        QFedAvg(client_learning_rate=0.1),
    ]


def test_every_strategy_is_in_the_summary_list() -> None:
    import fedcore.strategy

    strategies = {
        name
        for name in fedcore.strategy.__all__
        if isinstance(getattr(fedcore.strategy, name), type)
        and issubclass(getattr(fedcore.strategy, name), Strategy)
        and not inspect.isabstract(getattr(fedcore.strategy, name))
    }
    assert strategies <= {type(s).__name__ for s in _every_strategy()} | NEW_STRATEGIES


NEW_STRATEGIES = {
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "FedXgbBagging",
    "FedXgbCyclic",
}
"""Summarised in their own test files, which build them with the arguments they need."""


@pytest.mark.parametrize("strategy", _every_strategy(), ids=lambda s: type(s).__name__)
def test_every_strategy_logs_and_returns_a_summary(
    strategy: Strategy, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fedcore.strategy"):
        text = strategy.summary()
    lines = text.splitlines()
    assert lines[0] == type(strategy).__name__
    assert [r.getMessage() for r in caplog.records if r.name == "fedcore.strategy"] == lines
    assert len(lines) > 2
    assert lines[-1].startswith("└── ")


def test_summary_shows_each_setting_with_its_value() -> None:
    strategy = FedAvg(fraction_train=0.3, min_available_nodes=7, weighted_by_key="n")
    assert strategy.summary().splitlines() == [
        "FedAvg",
        "├── fraction_train: 0.3",
        "├── fraction_evaluate: 1.0",
        "├── min_train_nodes: 2",
        "├── min_evaluate_nodes: 2",
        "├── min_available_nodes: 7",
        "├── weighted_by_key: 'n'",
        "├── arrayrecord_key: 'arrays'",
        "├── configrecord_key: 'config'",
        "├── train_metrics_aggr_fn: None",
        "├── evaluate_metrics_aggr_fn: None",
        "├── round_timeout: None",
        "└── validate_replies: True",
    ]


def test_summary_of_a_subclass_has_its_own_and_its_bases_settings() -> None:
    def mean_loss(records: list[fc.RecordDict], key: str) -> fc.MetricRecord:
        return fc.MetricRecord()

    lines = FedAdam(eta=0.5, train_metrics_aggr_fn=mean_loss).summary().splitlines()
    assert lines[1] == "├── eta: 0.5"
    assert "├── fraction_train: 1.0" in lines
    assert (
        "├── train_metrics_aggr_fn: "
        "test_summary_of_a_subclass_has_its_own_and_its_bases_settings.<locals>.mean_loss"
    ) in lines


def test_summary_of_a_wrapper_nests_the_wrapped_strategy() -> None:
    wrapper = DifferentialPrivacyServerSideFixedClipping(FedMedian(), 1.5, 2.0, 10, seed=3)
    lines = wrapper.summary().splitlines()
    assert lines[:3] == [
        "DifferentialPrivacyServerSideFixedClipping",
        "├── strategy: FedMedian",
        "│   ├── fraction_train: 1.0",
    ]
    assert "│   ├── round_timeout: None" in lines
    assert "│   └── validate_replies: True" in lines
    assert lines[-4:] == [
        "├── noise_multiplier: 1.5",
        "├── clipping_norm: 2.0",
        "├── num_sampled_clients: 10",
        "└── seed: 3",
    ]
