"""q-FedAvg driven as the round driver drives it — configure_train, then aggregate_train
with the round's replies (its train_aggregation is None) — over two rounds, against the
q-FFL update of Li et al. (2020) written out here in plain numpy."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy.qfedavg import QFedAvg

NODES = [31, 32, 33]
Update = tuple[dict[str, np.ndarray], int, float]


def _answer(sent: Message, arrays: dict[str, np.ndarray], n: int, loss: float) -> Message:
    metrics = MetricRecord({"num-examples": n, "train_loss": loss})
    return Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}), reply_to=sent)


def _replies(messages: list[Message], updates: Sequence[Update | None]) -> list[Message]:
    replies = []
    for index, (sent, update) in enumerate(zip(messages, updates, strict=False)):
        sent.metadata.message_id = f"m{index}"
        if update is None:
            replies.append(Message(error=Error(8, "worker died"), reply_to=sent))
        else:
            replies.append(_answer(sent, *update))
    return replies


def _round(
    strategy: QFedAvg, server_round: int, arrays: ArrayRecord, updates: Sequence[Update | None]
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """One round as fedcore.strategy.rounds runs a strategy without a running aggregation."""
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), NODES)
    assert strategy.train_aggregation(server_round) is None
    return strategy.aggregate_train(server_round, _replies(messages, updates))


X0 = {
    "w": np.array([1.0, -1.0]),
    "b": np.array([[0.5]], dtype=np.float32),
    "steps": np.array([10]),
}


def _update(w: list[float], b: float, steps: int, n: int, loss: float) -> Update:
    arrays = {"w": np.array(w), "b": np.array([[b]], np.float32), "steps": np.array([steps])}
    return arrays, n, loss


ROUNDS = [
    (_update([0.5, -0.5], 1.0, 13, 1, 2.0), _update([2.0, -2.0], 0.0, 17, 3, 0.5)),
    (_update([1.0, 0.0], 0.25, 20, 2, 1.5), _update([0.0, 1.0], 0.75, 24, 2, 0.1)),
]


def _flat(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([arrays["w"], arrays["b"].ravel().astype(np.float64)])


def _qffl(w: np.ndarray, updates: tuple[Update, ...], q: float, lr: float) -> np.ndarray:
    """Li et al. 2020, Algorithm 2 (q-FedAvg), with L = 1 / lr and F_k offset by 1e-10."""
    big_l = 1.0 / lr
    delta_sum, h_sum = np.zeros_like(w), 0.0
    for arrays, _, loss in updates:
        f = loss + 1e-10
        dw = big_l * (w - _flat(arrays))
        delta_sum += f**q * dw
        h_sum += q * f ** (q - 1) * float(dw @ dw) + big_l * f**q
    return w - delta_sum / h_sum


def _two_rounds(strategy: QFedAvg, *, errors: bool = False) -> list[ArrayRecord]:
    arrays = ArrayRecord(X0)
    results = []
    for server_round, (first, second) in enumerate(ROUNDS, start=1):
        updates = [first, None, second] if errors else [first, second]
        new, _ = _round(strategy, server_round, arrays, updates)
        assert new is not None
        results.append(new)
        arrays = new
    return results


def test_two_rounds_follow_the_paper() -> None:
    x1, x2 = _two_rounds(QFedAvg(client_learning_rate=0.1, q=2.0))
    expected = _qffl(_flat(X0), ROUNDS[0], 2.0, 0.1)
    np.testing.assert_allclose(_flat(x1), expected, rtol=1e-6)
    expected = _qffl(_flat(x1), ROUNDS[1], 2.0, 0.1)
    np.testing.assert_allclose(_flat(x2), expected, rtol=1e-6)
    assert list(x2) == ["w", "b", "steps"]
    assert x2["b"].dtype == np.float32
    # Counters: the unweighted mean, rounded: (13 + 17) / 2, then (20 + 24) / 2.
    np.testing.assert_array_equal(x1["steps"], [15])
    np.testing.assert_array_equal(x2["steps"], [22])


def test_metrics_are_weighted_by_examples() -> None:
    strategy = QFedAvg(0.1)
    _, metrics = _round(strategy, 1, ArrayRecord(X0), ROUNDS[0])
    assert metrics is not None
    assert metrics["train_loss"] == pytest.approx((2.0 * 1 + 0.5 * 3) / 4)


def test_q_zero_is_the_unweighted_mean() -> None:
    arrays, _ = _round(QFedAvg(client_learning_rate=0.01, q=0.0), 1, ArrayRecord(X0), ROUNDS[0])
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [1.25, -1.25])
    np.testing.assert_allclose(arrays["b"], [[0.5]])


def test_error_replies_change_nothing() -> None:
    clean = _two_rounds(QFedAvg(0.1, 1.0))
    noisy = _two_rounds(QFedAvg(0.1, 1.0), errors=True)
    assert clean == noisy


def test_a_reply_without_a_usable_loss_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    strategy = QFedAvg(0.1, 1.0)
    messages = strategy.configure_train(1, ArrayRecord(X0), ConfigRecord(), NODES)
    first, second = ROUNDS[0]
    replies = _replies(messages, [first, first, second])
    del replies[1].content["metrics"]["train_loss"]
    with caplog.at_level(logging.WARNING):
        skipped, _ = strategy.aggregate_train(1, replies)
    expected, _ = strategy.aggregate_train(1, [replies[0], replies[2]])
    assert skipped == expected
    assert "node 32 not aggregated: metric 'train_loss'" in caplog.text
    negative = _replies(messages, [_update([0.0, 0.0], 0.0, 0, 1, -1.0)])
    assert strategy.aggregate_train(1, negative) == (None, None)


def test_no_usable_reply_is_no_update() -> None:
    strategy = QFedAvg(0.1)
    messages = strategy.configure_train(1, ArrayRecord(X0), ConfigRecord(), NODES)
    assert strategy.aggregate_train(1, _replies(messages, [None, None])) == (None, None)


def test_replies_of_another_layout_are_refused() -> None:
    wide: Update = (
        {"w": np.zeros(5), "b": np.zeros((1, 1), np.float32), "steps": np.array([1])},
        1,
        1.0,
    )
    with pytest.raises(ValueError, match=r"'w' has shape \[5\], the model's has \[2\]"):
        _round(QFedAvg(0.1), 1, ArrayRecord(X0), [wide])


def test_aggregating_before_configuring_is_an_error() -> None:
    sent = Message(RecordDict(), 31, "train")
    with pytest.raises(RuntimeError, match="configure_train"):
        QFedAvg(0.1).aggregate_train(1, [_answer(sent, {"w": np.zeros(1)}, 1, 1.0)])


def test_flower_arguments() -> None:
    strategy = QFedAvg(0.05)
    assert (strategy.client_learning_rate, strategy.q, strategy.train_loss_key) == (
        0.05,
        0.1,
        "train_loss",
    )
    strategy = QFedAvg(0.05, 0.5, "loss", 0.5)
    assert (strategy.q, strategy.train_loss_key, strategy.fraction_train) == (0.5, "loss", 0.5)
    with pytest.raises(TypeError, match="client_learning_rate"):
        QFedAvg()  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("arguments", "error", "name"),
    [
        ({"client_learning_rate": 0.0}, ValueError, "client_learning_rate"),
        ({"client_learning_rate": "0.1"}, TypeError, "client_learning_rate"),
        ({"client_learning_rate": 0.1, "q": -1.0}, ValueError, "q"),
        ({"client_learning_rate": 0.1, "train_loss_key": 3}, TypeError, "train_loss_key"),
        ({"client_learning_rate": 0.1, "min_available_nodes": -1}, ValueError, "min_available"),
    ],
)
def test_bad_arguments(arguments: dict[str, object], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        QFedAvg(**arguments)  # type: ignore[arg-type]
