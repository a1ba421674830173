"""FedAvg's pure methods, tested without a Grid."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy import FedAvg

ARRAYS = ArrayRecord({"w": np.zeros(2)})


def _reply(node: int, w: list[float], n: int, **metrics: float) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": np.array(w)}),
            "metrics": MetricRecord({"num-examples": n, **metrics}),
        }
    )
    reply = Message(content, reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _error(node: int) -> Message:
    sent = Message(RecordDict(), node, "train")
    return Message(error=Error(2, "boom"), reply_to=sent)


@pytest.mark.parametrize(
    ("fraction", "minimum", "available", "expected"),
    [(0.1, 2, 100, 10), (0.1, 2, 10, 2), (0.5, 0, 9, 4), (1.0, 2, 7, 7), (0.01, 30, 20, 20)],
)
def test_sample_size(fraction: float, minimum: int, available: int, expected: int) -> None:
    strategy = FedAvg(fraction_train=fraction, min_train_nodes=minimum)
    node_ids = list(range(100, 100 + available))
    messages = strategy.configure_train(1, ARRAYS, ConfigRecord(), node_ids)
    assert [m.metadata.dst_node_id for m in messages] == node_ids[:expected]


def test_configure_train_content() -> None:
    config = ConfigRecord({"lr": 0.1})
    messages = FedAvg().configure_train(4, ARRAYS, config, [7, 8])
    for message in messages:
        assert message.metadata.message_type == "train"
        assert message.content["arrays"] is ARRAYS
        assert message.content["config"]["server-round"] == 4
        assert message.content["config"]["lr"] == 0.1
    assert "server-round" not in config


def test_custom_keys_and_evaluate() -> None:
    strategy = FedAvg(
        fraction_evaluate=0.5, min_evaluate_nodes=1, arrayrecord_key="model", configrecord_key="cfg"
    )
    (message,) = strategy.configure_evaluate(1, ARRAYS, ConfigRecord(), [1, 2, 3])
    assert message.metadata.message_type == "evaluate"
    assert set(message.content) == {"model", "cfg"}


def test_fraction_zero_configures_nothing_and_waits_for_no_one() -> None:
    strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=5)
    assert strategy.configure_evaluate(1, ARRAYS, ConfigRecord(), [1, 2]) == []
    assert strategy.min_nodes("evaluate") == 0
    assert strategy.min_nodes("train") == 5


def test_aggregate_train_weighted_by_examples() -> None:
    replies = [_reply(1, [1.0, 1.0], 1, loss=1.0), _reply(2, [4.0, 7.0], 2, loss=4.0)]
    arrays, metrics = FedAvg().aggregate_train(1, replies)
    assert arrays is not None
    assert metrics is not None
    np.testing.assert_allclose(arrays["w"], [3.0, 5.0])  # (1 + 8) / 3, (1 + 14) / 3
    assert metrics["loss"] == pytest.approx(3.0)


def test_error_replies_are_never_aggregated() -> None:
    replies = [_reply(1, [2.0, 2.0], 5), _error(2), _error(3)]
    arrays, _ = FedAvg().aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], [2.0, 2.0])
    assert FedAvg().aggregate_train(1, [_error(1)]) == (None, None)
    assert FedAvg().aggregate_evaluate(1, [_error(1)]) is None


def test_malformed_replies_are_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    no_weight = _reply(2, [9.0, 9.0], 1)
    del no_weight.content["metrics"]["num-examples"]
    wrong_shape = _reply(3, [9.0, 9.0, 9.0], 1)
    with caplog.at_level(logging.WARNING):
        arrays, _ = FedAvg().aggregate_train(1, [_reply(1, [1.0, 1.0], 1), no_weight, wrong_shape])
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], [1.0, 1.0])
    assert "node 2 not aggregated" in caplog.text
    assert "node 3 not aggregated" in caplog.text


def test_all_zero_weights_leave_the_model_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    arrays, metrics = FedAvg().aggregate_train(1, [_reply(1, [1.0, 1.0], 0, loss=2.0)])
    assert arrays is None
    assert metrics is not None
    assert metrics["loss"] == 2.0
    assert "weigh 0 examples" in caplog.text


def test_aggregate_evaluate() -> None:
    replies = [_reply(1, [0.0, 0.0], 1, accuracy=0.5), _reply(2, [0.0, 0.0], 3, accuracy=1.0)]
    metrics = FedAvg().aggregate_evaluate(1, replies)
    assert metrics is not None
    assert metrics["accuracy"] == pytest.approx(0.875)


def test_custom_metric_aggregation() -> None:
    def count(contents: list[RecordDict], key: str) -> MetricRecord:
        return MetricRecord({"replies": len(contents), "key": len(key)})

    metrics = FedAvg(evaluate_metrics_aggr_fn=count).aggregate_evaluate(
        1, [_reply(1, [0.0, 0.0], 1)]
    )
    assert metrics == MetricRecord({"replies": 1, "key": len("num-examples")})


@pytest.mark.parametrize(
    "arguments",
    [
        {"fraction_train": 1.5},
        {"fraction_evaluate": -0.1},
        {"min_train_nodes": -1},
        {"min_available_nodes": 2.5},
        {"fraction_train": True},
    ],
)
def test_bad_arguments(arguments: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError), match="must be"):
        FedAvg(**arguments)  # type: ignore[arg-type]
