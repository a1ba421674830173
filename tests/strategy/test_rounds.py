"""The round driver: seeded sampling, determinism, failures, timeouts and reports."""

from __future__ import annotations

import logging
import random
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import Run
from fedcore.errors import NotEnoughNodesError
from fedcore.strategy import FedAvg, Result
from fedcore.strategy.rounds import HELD_REPLIES, _InOrder, sampling_seed, shuffled
from fedcore.testing import FakeClock, round_reports
from fedcore.testing.backends import backend_params

pytestmark = pytest.mark.anyio


def test_shuffled_is_fixed_by_seed_round_and_phase() -> None:
    nodes = list(range(50))
    assert shuffled(nodes, 1, 1, "train") == shuffled(reversed(nodes), 1, 1, "train")
    assert shuffled(nodes, 1, 1, "train") != shuffled(nodes, 2, 1, "train")
    assert shuffled(nodes, 1, 1, "train") != shuffled(nodes, 1, 2, "train")
    assert shuffled(nodes, 1, 1, "train") != shuffled(nodes, 1, 1, "evaluate")
    assert sorted(shuffled(nodes, None, 1, "train")) == nodes


def test_sampling_seed_precedence() -> None:
    assert sampling_seed(Run(1, {"seed": 4}, seed=9)) == 9
    assert sampling_seed(Run(1, {"seed": 4})) == 4
    assert sampling_seed(Run(1, {"seed": "4"})) is None
    assert sampling_seed(Run(1, {})) is None


def _client(*, jitter: bool = False, fail_partition: int | None = None) -> fc.ClientApp:
    """A ClientApp whose update depends on its partition; ``jitter`` scrambles arrival order."""
    client = fc.ClientApp()
    chaos = random.Random()

    @client.train()
    async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        partition = context.node_config["partition-id"]
        if jitter:
            for _ in range(chaos.randrange(20)):
                await anyio.lowlevel.checkpoint()
        if partition == fail_partition:
            raise RuntimeError("disk full")
        # Magnitudes far apart, so that a sum taken in another order rounds differently.
        noise = np.random.default_rng(partition).standard_normal(1000)
        w = msg.content["arrays"]["w"] + noise * 10.0 ** (partition % 12 - 6)
        update = fc.ArrayRecord({"w": w})
        metrics = fc.MetricRecord({"num-examples": partition + 1, "partition": partition})
        return fc.Message(fc.RecordDict({"arrays": update, "metrics": metrics}), reply_to=msg)

    @client.evaluate()
    def evaluate(msg: fc.Message, context: fc.Context) -> fc.Message:
        metrics = fc.MetricRecord(
            {"num-examples": 1, "partition": context.node_config["partition-id"]}
        )
        return fc.Message(fc.RecordDict({"metrics": metrics}), reply_to=msg)

    return client


def _app(client: fc.ClientApp, strategy: FedAvg, **start: Any) -> fc.App:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        w0 = fc.ArrayRecord({"w": np.full(1000, 0.5)})
        return await strategy.start(grid=grid, initial_arrays=w0, **start)

    return fc.App(server=server, client=client)


JITTERY = _client(jitter=True)
PLAIN = _client()


async def _run(seed: int, *, client: fc.ClientApp = PLAIN, backend: str = "inline") -> Result:
    app = _app(client, FedAvg(fraction_train=0.2, fraction_evaluate=0.1), num_rounds=4)
    result: Result = (await fc.simulate(app, nodes=30, seed=seed, backend=backend)).value
    return result


@pytest.mark.parametrize("backend", backend_params())
async def test_same_seed_same_cohorts_and_model_bit_for_bit(backend: str) -> None:
    """Replies arrive in a different order every run (jitter); the model must not notice.

    The updates are float64 with magnitudes twelve orders apart, so aggregating them
    in arrival order would change the last bits: this test fails if the driver
    stops restoring the send order before aggregation.
    """
    first = await _run(7, client=JITTERY, backend=backend)
    second = await _run(7, client=JITTERY, backend=backend)
    assert first.arrays == second.arrays
    assert first.train_metrics_clientapp == second.train_metrics_clientapp
    assert first.evaluate_metrics_clientapp == second.evaluate_metrics_clientapp


async def test_different_seed_different_cohorts() -> None:
    first, second = await _run(7), await _run(8)
    assert first.train_metrics_clientapp != second.train_metrics_clientapp


async def test_result_and_server_evaluation_per_round() -> None:
    calls: list[int] = []

    def evaluate_fn(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord:
        calls.append(server_round)
        return fc.MetricRecord({"mean": float(arrays["w"].mean())})

    strategy = FedAvg(fraction_train=0.5, fraction_evaluate=0.0)
    app = _app(_client(), strategy, num_rounds=3, evaluate_fn=evaluate_fn)
    result: Result = (await fc.simulate(app, nodes=4, seed=0, backend="inline")).value
    assert calls == [0, 1, 2, 3]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert result.evaluate_metrics_clientapp == {}
    assert result.evaluate_metrics_serverapp[0]["mean"] == pytest.approx(0.5)
    assert result.arrays["w"].dtype == np.float64


async def test_async_evaluate_fn_and_bad_return() -> None:
    async def evaluate_fn(server_round: int, arrays: fc.ArrayRecord) -> fc.MetricRecord | None:
        return None if server_round else fc.MetricRecord({"r": server_round})

    app = _app(_client(), FedAvg(fraction_evaluate=0.0), num_rounds=1, evaluate_fn=evaluate_fn)
    result: Result = (await fc.simulate(app, nodes=2, seed=0, backend="inline")).value
    assert list(result.evaluate_metrics_serverapp) == [0]

    def wrong(server_round: int, arrays: fc.ArrayRecord) -> dict[str, float]:
        return {"accuracy": 1.0}

    app = _app(_client(), FedAvg(), num_rounds=1, evaluate_fn=wrong)
    with pytest.raises(TypeError, match="evaluate_fn must return a MetricRecord"):
        await fc.simulate(app, nodes=2, seed=0, backend="inline")


async def test_failures_are_counted_reported_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedcore")
    app = _app(_client(fail_partition=2), FedAvg(fraction_evaluate=0.0), num_rounds=2)
    result: Result = (await fc.simulate(app, nodes=4, seed=0, backend="inline")).value
    reports = round_reports(caplog.records)
    assert [(r.server_round, r.replies, r.failures) for r in reports] == [(1, 3, 1), (2, 3, 1)]
    expected = "1 failures: 1× error 2 (CLIENT_APP_RAISED_EXCEPTION): RuntimeError: disk full"
    assert f"round 1 train: {expected}" in caplog.text
    assert sorted(result.train_metrics_clientapp) == [1, 2]


async def test_sync_main_can_start_a_strategy() -> None:
    server = fc.ServerApp()

    @server.main()
    def main(grid: fc.SyncGrid, context: fc.Context) -> Result:
        w0 = fc.ArrayRecord({"w": np.zeros(1000, np.float32)})
        return FedAvg(fraction_evaluate=0.0).start(grid=grid, initial_arrays=w0, num_rounds=2)

    result: Result = (
        await fc.simulate(fc.App(server=server, client=PLAIN), nodes=3, seed=0, backend="inline")
    ).value
    assert sorted(result.train_metrics_clientapp) == [1, 2]


async def test_round_timeout_counts_missing_replies_as_failures(fake_clock: FakeClock) -> None:
    client = fc.ClientApp()

    @client.train()
    async def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        await anyio.Event().wait()
        raise AssertionError("unreachable")

    outcome: list[Result] = []

    async def simulate() -> None:
        app = _app(client, FedAvg(fraction_evaluate=0.0), num_rounds=1, timeout=30)
        result = await fc.simulate(app, nodes=2, seed=0, clock=fake_clock, backend="inline")
        outcome.append(result.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(simulate)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(30)
    assert outcome[0].train_metrics_clientapp == {}


async def test_waiting_for_nodes_times_out(fake_clock: FakeClock) -> None:
    errors: list[Exception] = []

    async def simulate() -> None:
        app = _app(_client(), FedAvg(min_available_nodes=5), num_rounds=1, timeout=60)
        try:
            await fc.simulate(app, nodes=3, seed=0, clock=fake_clock, backend="inline")
        except NotEnoughNodesError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(simulate)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(60)
    assert [str(e) for e in errors] == ["waited 60 s for 5 nodes; only 3 came online"]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"initial_arrays": {"w": 1}}, "initial_arrays must be an ArrayRecord"),
        ({"num_rounds": -1}, "num_rounds"),
        ({"timeout": 0}, "timeout"),
    ],
)
async def test_start_checks_its_arguments(arguments: dict[str, Any], error: str) -> None:
    options = {"initial_arrays": fc.ArrayRecord(), "num_rounds": 1, **arguments}
    with pytest.raises((TypeError, ValueError), match=error):
        FedAvg().start(grid=None, **options)  # type: ignore[call-overload]


def test_in_order_folds_in_send_order_whatever_the_arrival_order() -> None:
    ids = [f"m{i}" for i in range(6)]
    folded: list[str] = []
    in_order = _InOrder(ids, lambda reply: folded.append(reply.metadata.reply_to_message_id))
    for i in (2, 0, 1, 5, 3):
        in_order.add(_arrived(f"m{i}"))
    assert folded == ["m0", "m1", "m2", "m3"]
    in_order.finish()  # m4 never came
    assert folded == ["m0", "m1", "m2", "m3", "m5"]


def test_in_order_holds_a_bounded_number_of_replies() -> None:
    ids = [f"m{i}" for i in range(HELD_REPLIES + 10)]
    folded: list[str] = []
    in_order = _InOrder(ids, lambda reply: folded.append(reply.metadata.reply_to_message_id))
    for message_id in ids[1:]:
        in_order.add(_arrived(message_id))
    assert len(folded) == 9  # the straggler m0 is still missing; only HELD_REPLIES wait
    in_order.add(_arrived("m0"))
    in_order.finish()
    assert sorted(folded) == sorted(ids)


def _arrived(message_id: str) -> fc.Message:
    sent = fc.Message(fc.RecordDict(), 1, "train")
    sent.metadata.message_id = message_id
    return fc.Message(fc.RecordDict(), reply_to=sent)
