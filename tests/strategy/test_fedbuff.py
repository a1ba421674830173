"""FedBuff: the staleness-weighted buffer by hand, and the asynchronous driver in simulation."""

from __future__ import annotations

import logging

import anyio
import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy import FedBuff
from fedcore.testing import round_reports

W0 = ArrayRecord({"w": np.array([0.0, 0.0]), "n": np.array([10], dtype=np.int64)})
W1 = ArrayRecord({"w": np.array([1.0, 2.0]), "n": np.array([12], dtype=np.int64)})


def _answer(sent: Message, w: list[float], n: int, examples: int) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": np.array(w), "n": np.array([n], dtype=np.int64)}),
            "metrics": MetricRecord({"num-examples": examples, "train_loss": float(examples)}),
        }
    )
    return Message(content, reply_to=sent)


def _sent(
    strategy: FedBuff, server_round: int, arrays: ArrayRecord, nodes: list[int]
) -> list[Message]:
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), nodes)
    for index, message in enumerate(messages):
        message.metadata.message_id = f"r{server_round}-{index}"
    return messages


def test_stale_updates_count_less_by_hand() -> None:
    strategy = FedBuff(buffer_size=2, server_learning_rate=0.5)
    (old,) = _sent(strategy, 1, W0, [1])
    (new,) = _sent(strategy, 2, W1, [2])
    replies = [_answer(old, [4.0, 0.0], 13, 1), _answer(new, [1.0, 5.0], 12, 3)]
    arrays, metrics = strategy.aggregate_train(2, replies)
    assert arrays is not None
    assert metrics is not None
    # Δ_old = [4, 0] (staleness 1, weight 1/√2), Δ_new = [0, 3] (staleness 0), n = 1 and 3:
    # W1 + 0.5 × (1·(1/√2)·Δ_old + 3·Δ_new) / (1 + 3)
    expected = np.array([1.0, 2.0]) + 0.5 * (np.array([4.0, 0.0]) / np.sqrt(2) + [0.0, 9.0]) / 4
    np.testing.assert_allclose(arrays["w"], expected)
    # The counter's updates are 3 (stale) and 0: 12 + 0.5 × 3/√2/4 = 12.27 → 12.
    assert arrays["n"].dtype == np.int64
    assert arrays["n"].tolist() == [12]
    assert metrics["train_loss"] == pytest.approx((1 * 1 + 3 * 3) / 4)
    assert metrics["staleness"] == pytest.approx(0.5)


def test_staleness_weight_follows_the_exponent() -> None:
    assert FedBuff().staleness_weight(3) == pytest.approx(0.5)
    assert FedBuff(staleness_exponent=1.0).staleness_weight(3) == pytest.approx(0.25)
    assert FedBuff(staleness_exponent=0.0).staleness_weight(9) == 1.0


def test_error_replies_are_not_aggregated() -> None:
    strategy = FedBuff()
    first, second = _sent(strategy, 1, W0, [1, 2])
    good = _answer(first, [2.0, 2.0], 10, 1)
    failed = Message(error=Error(2, "boom"), reply_to=second)
    with_error, _ = strategy.aggregate_train(1, [failed, good])
    alone, _ = strategy.aggregate_train(1, [good])
    assert with_error == alone
    assert with_error is not None
    np.testing.assert_allclose(with_error["w"], [2.0, 2.0])


def test_too_stale_and_unknown_replies_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    strategy = FedBuff(max_staleness=0)
    (old,) = _sent(strategy, 1, W0, [1])
    (new,) = _sent(strategy, 2, W1, [2])
    stranger = Message(RecordDict(), 3, "train", group_id="other")
    with caplog.at_level(logging.WARNING, logger="fedcore.strategy"):
        arrays, _ = strategy.aggregate_train(
            2,
            [
                _answer(old, [9.0, 9.0], 10, 1),
                _answer(stranger, [9.0, 9.0], 10, 1),
                _answer(new, [3.0, 2.0], 12, 1),
            ],
        )
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [3.0, 2.0])
    assert "1 models stale" in caplog.text
    assert "unknown round 'other'" in caplog.text


def test_forget_drops_the_arrays_no_reply_needs() -> None:
    strategy = FedBuff()
    _sent(strategy, 1, W0, [1])
    _sent(strategy, 2, W1, [2])
    strategy.forget({2})
    with pytest.raises(ValueError, match="no arrays were configured for round 1"):
        strategy.train_aggregation(1)
    assert strategy.train_aggregation(2).size == 0


@pytest.mark.parametrize(
    "arguments",
    [
        {"buffer_size": 0},
        {"concurrency": -1},
        {"server_learning_rate": 0.0},
        {"staleness_exponent": -0.5},
        {"max_staleness": -1},
        {"buffer_size": 2.5},
    ],
)
def test_bad_arguments(arguments: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError), match="must be"):
        FedBuff(**arguments)  # type: ignore[arg-type]


# The asynchronous driver, in simulation.


def _app(strategy: FedBuff, client: fc.ClientApp, rounds: int, **start: object) -> fc.App:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> object:
        return await strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord({"w": np.zeros(3)}),
            num_rounds=rounds,
            **start,  # type: ignore[arg-type]
        )

    return fc.App(server, client)


def _client(*, hang: set[int] = frozenset(), fail: set[int] = frozenset()) -> fc.ClientApp:  # type: ignore[assignment]
    """Each node moves the model one step towards its partition id, at its own pace."""
    client = fc.ClientApp()

    @client.train()
    async def train(msg: Message, context: fc.Context) -> Message:
        partition = context.node_config["partition-id"]
        if partition in hang:
            await anyio.sleep_forever()
        if partition in fail:
            raise RuntimeError("no data")
        await anyio.sleep(0.001 * (partition % 4))
        w = msg.content["arrays"]["w"] + 1.0
        metrics = MetricRecord({"num-examples": 1})
        return Message(
            RecordDict({"arrays": ArrayRecord({"w": w}), "metrics": metrics}), reply_to=msg
        )

    @client.evaluate()
    def evaluate(msg: Message, context: fc.Context) -> Message:
        metrics = MetricRecord({"num-examples": 1, "w": float(msg.content["arrays"]["w"][0])})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return client


@pytest.mark.anyio
async def test_every_step_is_made_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    strategy = FedBuff(buffer_size=3, concurrency=4, fraction_evaluate=0.5)
    with caplog.at_level(logging.INFO, logger="fedcore"):
        outcome = await fc.simulate(_app(strategy, _client(), 6), nodes=8, backend="inline", seed=1)
    result = outcome.value
    reports = round_reports(caplog.records)
    assert [r.server_round for r in reports] == [1, 2, 3, 4, 5, 6]
    assert all(r.replies == 3 and r.failures == 0 for r in reports)
    # Every update is +1 on the model it started from, weighted down by its staleness:
    # each step moves w by at most 1 (all fresh) and by more than 0.
    w = result.arrays["w"]
    assert 0 < w[0] <= 6
    assert np.all(w == w[0])
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4, 5, 6]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3, 4, 5, 6]
    assert strategy._sent == {}


@pytest.mark.anyio
async def test_failed_nodes_wait_for_the_next_step(caplog: pytest.LogCaptureFixture) -> None:
    """Node 2 fails at once, every time: it is not restarted within a step, so it cannot
    fill the buffer with failures while the healthy nodes still work."""
    strategy = FedBuff(buffer_size=3, concurrency=2)
    with caplog.at_level(logging.INFO, logger="fedcore"):
        outcome = await fc.simulate(
            _app(strategy, _client(fail={2}), 4), nodes=4, backend="inline", seed=3
        )
    reports = round_reports(caplog.records)
    assert [r.server_round for r in reports] == [1, 2, 3, 4]
    assert all(r.replies == 3 for r in reports)
    assert all(r.failures <= 1 for r in reports)
    assert outcome.value.arrays["w"][0] > 0


@pytest.mark.anyio
async def test_a_step_whose_nodes_all_fail_or_hang_closes_and_the_run_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = FedBuff(buffer_size=4, concurrency=4)
    with caplog.at_level(logging.INFO, logger="fedcore"):
        outcome = await fc.simulate(
            _app(strategy, _client(hang={0, 1}, fail={2, 3}), 2, timeout=0.2),
            nodes=4,
            backend="inline",
            seed=3,
        )
    reports = round_reports(caplog.records)
    assert [(r.replies, r.failures) for r in reports] == [(0, 4), (0, 4)]
    assert "every node available failed" in caplog.text
    # A hung node's message expires (its TTL is the round's limit): a code-3 failure.
    assert "message expired: no reply within its TTL of 0.2 s" in caplog.text
    np.testing.assert_array_equal(outcome.value.arrays["w"], np.zeros(3))


def test_zero_dimensional_arrays_stay_arrays() -> None:
    strategy = FedBuff()
    start = ArrayRecord({"count": np.array(4, dtype=np.int64), "w": np.array(1.0, np.float32)})
    (sent,) = _sent(strategy, 1, start, [1])
    content = RecordDict(
        {
            "arrays": ArrayRecord(
                {"count": np.array(6, dtype=np.int64), "w": np.array(2.0, np.float32)}
            ),
            "metrics": MetricRecord({"num-examples": 3}),
        }
    )
    arrays, _ = strategy.aggregate_train(1, [Message(content, reply_to=sent)])
    assert arrays is not None
    assert arrays["count"].shape == ()
    assert int(arrays["count"]) == 6
    assert arrays["w"].dtype == np.float32
    assert float(arrays["w"]) == 2.0
