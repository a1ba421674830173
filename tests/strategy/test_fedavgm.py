"""FedAvgM driven as the round driver drives it: configure_train, then the running
aggregation (its train_aggregation is not None), over two rounds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy.fedavgm import FedAvgM

NODES = [11, 12, 13]


def _answer(sent: Message, arrays: dict[str, np.ndarray], n: int) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": n})}
    )
    return Message(content, reply_to=sent)


def _round(
    strategy: FedAvgM,
    server_round: int,
    arrays: ArrayRecord,
    updates: Sequence[tuple[dict[str, np.ndarray], int] | None],
) -> ArrayRecord | None:
    """One round as fedcore.strategy.rounds runs it; ``None`` in ``updates`` is an error reply."""
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), NODES)
    aggregation = strategy.train_aggregation(server_round)
    assert aggregation is not None
    for index, (sent, update) in enumerate(zip(messages, updates, strict=False)):
        sent.metadata.message_id = f"{server_round}.{index}"
        if update is None:
            aggregation.add(Message(error=Error(2, "out of memory"), reply_to=sent))
        else:
            aggregation.add(_answer(sent, *update))
    return aggregation.result()[0]


X0 = {"w": np.array([1.0, -2.0]), "b": np.array([[0.5]], dtype=np.float32)}
ROUND_1 = [
    ({"w": np.array([0.0, -1.0]), "b": np.array([[1.5]], dtype=np.float32)}, 1),
    ({"w": np.array([2.0, -3.0]), "b": np.array([[0.5]], dtype=np.float32)}, 3),
]
ROUND_2 = [
    ({"w": np.array([1.0, 1.0]), "b": np.array([[0.0]], dtype=np.float32)}, 2),
    ({"w": np.array([3.0, 0.0]), "b": np.array([[1.0]], dtype=np.float32)}, 2),
]


def _mean(updates: list[tuple[dict[str, np.ndarray], int]], key: str) -> np.ndarray:
    (first, n1), (second, n2) = updates
    total = first[key].astype(np.float64) * n1 + second[key].astype(np.float64) * n2
    mean: np.ndarray = total / (n1 + n2)
    return mean


def test_two_rounds_of_server_momentum() -> None:
    strategy = FedAvgM(server_learning_rate=0.7, server_momentum=0.9)
    x1 = _round(strategy, 1, ArrayRecord(X0), ROUND_1)
    assert x1 is not None
    x2 = _round(strategy, 2, x1, ROUND_2)
    assert x2 is not None

    for key in ("w", "b"):
        x = X0[key].astype(np.float64)
        velocity = np.zeros_like(x)
        for updates in (ROUND_1, ROUND_2):
            velocity = 0.9 * velocity + (x - _mean(updates, key))
            x = x - 0.7 * velocity
        np.testing.assert_allclose(x2[key], x, rtol=1e-6)
    # By hand for "w", round 1: mean (1.5, -2.5), v = (-0.5, 0.5), x1 = (1.35, -2.35).
    np.testing.assert_allclose(x1["w"], [1.35, -2.35])
    assert x2["b"].dtype == np.float32
    assert list(strategy.momentum_vector) == ["w", "b"]


def test_error_replies_change_nothing() -> None:
    clean, noisy = (FedAvgM(server_learning_rate=0.5, server_momentum=0.5) for _ in range(2))
    results = []
    for strategy, errors in ((clean, False), (noisy, True)):
        arrays: ArrayRecord | None = ArrayRecord(X0)
        for server_round, (first, second) in enumerate((ROUND_1, ROUND_2), start=1):
            assert arrays is not None
            updates = [first, None, second] if errors else [first, second]
            arrays = _round(strategy, server_round, arrays, updates)
        results.append(arrays)
    assert results[0] == results[1]


def test_defaults_are_fedavg_exactly() -> None:
    strategy = FedAvgM()
    assert (strategy.server_learning_rate, strategy.server_momentum) == (1.0, 0.0)
    assert not strategy.server_opt
    x1 = _round(strategy, 1, ArrayRecord(X0), ROUND_1)
    assert x1 is not None
    np.testing.assert_array_equal(x1["w"], [1.5, -2.5])
    assert strategy.momentum_vector == {}


def test_server_learning_rate_alone_keeps_no_momentum() -> None:
    strategy = FedAvgM(server_learning_rate=0.5)
    x1 = _round(strategy, 1, ArrayRecord(X0), ROUND_1)
    assert x1 is not None
    # x0 − 0.5 (x0 − mean) with mean (1.5, −2.5): (1.25, −2.25)
    np.testing.assert_allclose(x1["w"], [1.25, -2.25])
    assert strategy.momentum_vector == {}


def test_integer_counters_take_the_mean() -> None:
    strategy = FedAvgM(server_learning_rate=0.1, server_momentum=0.5)
    x0 = ArrayRecord({"w": np.zeros(1), "steps": np.array([10])})
    update: dict[str, np.ndarray] = {"w": np.ones(1), "steps": np.array([14])}
    updates = [(update, 1), (update, 1)]
    x1 = _round(strategy, 1, x0, updates)
    assert x1 is not None
    assert x1["steps"] == 14
    assert x1["steps"].dtype == x0["steps"].dtype
    np.testing.assert_allclose(x1["w"], [0.1])
    assert list(strategy.momentum_vector) == ["w"]


def test_a_model_with_another_layout_is_refused() -> None:
    strategy = FedAvgM(server_momentum=0.5)
    x1 = _round(strategy, 1, ArrayRecord(X0), ROUND_1)
    assert x1 is not None
    kept = dict(strategy.momentum_vector)
    grown: dict[str, np.ndarray] = {"w": np.zeros(3), "b": np.zeros((1, 1), np.float32)}
    with pytest.raises(ValueError, match="momentum_vector"):
        _round(strategy, 2, ArrayRecord(grown), [(grown, 1)])
    assert strategy.momentum_vector == kept


def test_aggregating_before_configuring_is_an_error() -> None:
    sent = Message(RecordDict(), 11, "train")
    aggregation = FedAvgM(server_momentum=0.5).train_aggregation(1)
    assert aggregation is not None
    aggregation.add(_answer(sent, {"w": np.zeros(1)}, 1))
    with pytest.raises(RuntimeError, match="configure_train"):
        aggregation.result()


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"server_learning_rate": 0.0}, ValueError),
        ({"server_learning_rate": "1"}, TypeError),
        ({"server_momentum": 1.0}, ValueError),
        ({"server_momentum": -0.1}, ValueError),
        ({"fraction_train": 2.0}, ValueError),
    ],
)
def test_bad_arguments(arguments: dict[str, object], error: type[Exception]) -> None:
    name = next(iter(arguments))
    with pytest.raises(error, match=name):
        FedAvgM(**arguments)  # type: ignore[arg-type]


def test_arguments_are_flowers_positional_order() -> None:
    strategy = FedAvgM(0.5, 0.5, 3, 3, 3, "n", "a", "c", None, None, 0.2, 0.3)
    assert (strategy.server_learning_rate, strategy.server_momentum) == (0.2, 0.3)
