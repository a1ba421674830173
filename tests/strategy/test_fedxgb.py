"""FedXgbBagging and FedXgbCyclic: trees appended by hand and by real boosters' sums.

Bagging is checked two ways: on JSON models built here, where the expected merged
model is written out; and, with xgboost installed, on real boosters, where a bagged
model must predict (as a margin) the sum of what its parts predict.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy import FedXgbBagging, FedXgbCyclic

EMPTY = ArrayRecord({"0": np.empty(0, dtype=np.uint8)})


def _record(model: bytes) -> ArrayRecord:
    return ArrayRecord({"0": np.frombuffer(model, dtype=np.uint8)})


def _bytes(record: ArrayRecord) -> bytes:
    (array,) = record.values()
    return array.tobytes()


def _reply(node: int, arrays: ArrayRecord, n: int = 10) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    content = RecordDict(
        {"arrays": arrays, "metrics": MetricRecord({"num-examples": n, "auc": node / 10})}
    )
    reply = Message(content, reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _tree(tag: float) -> dict[str, Any]:
    """A stand-in tree: bagging must carry it over untouched but for its id."""
    return {
        "id": -1,
        "base_weights": [tag],
        "left_children": [-1],
        "tree_param": {"num_nodes": "1"},
    }


def _model(*rounds: list[float], base_score: str = "[5E-1]") -> bytes:
    """A JSON model whose round i holds one tree per tag in ``rounds[i]``."""
    trees, indptr = [], [0]
    for tags in rounds:
        trees.extend(_tree(tag) for tag in tags)
        indptr.append(len(trees))
    for index, tree in enumerate(trees):
        tree["id"] = index
    model = {
        "learner": {
            "learner_model_param": {"base_score": base_score},
            "gradient_booster": {
                "name": "gbtree",
                "model": {
                    "gbtree_model_param": {"num_trees": str(len(trees)), "num_parallel_tree": "1"},
                    "trees": trees,
                    "tree_info": [0] * len(trees),
                    "iteration_indptr": indptr,
                },
            },
        },
        "version": [3, 2, 0],
    }
    return json.dumps(model).encode()


def _bag(strategy: FedXgbBagging, sent: ArrayRecord, replies: list[Message]) -> tuple[Any, Any]:
    strategy.configure_train(1, sent, ConfigRecord(), [1, 2, 3])
    assert strategy.train_aggregation(1) is None  # bagging takes the replies as a list
    return strategy.aggregate_train(1, replies)


def test_bagging_appends_each_replys_trees_in_send_order() -> None:
    strategy = FedXgbBagging()
    sent = _record(_model([1.0], [2.0]))
    replies = [_reply(1, _record(_model([3.0]))), _reply(2, _record(_model([4.0], [5.0])))]

    arrays, metrics = _bag(strategy, sent, replies)

    # global rounds (1)(2), node 1's round (3), node 2's two rounds (4)(5)
    assert json.loads(_bytes(arrays)) == json.loads(_model([1.0], [2.0], [3.0], [4.0], [5.0]))
    assert metrics is not None
    assert dict(metrics) == {"auc": pytest.approx(0.15)}


def test_bagging_an_empty_model_starts_from_the_first_reply() -> None:
    first = _model([3.0], base_score="[2E-1]")
    arrays, _ = _bag(
        FedXgbBagging(), EMPTY, [_reply(1, _record(first)), _reply(2, _record(_model([4.0])))]
    )

    assert json.loads(_bytes(arrays)) == json.loads(_model([3.0], [4.0], base_score="[2E-1]"))


def test_bagging_leaves_out_errors_and_bytes_that_are_no_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent = Message(RecordDict(), 3, "train")
    error = Message(error=Error(2, "boom"), reply_to=sent)
    replies = [
        _reply(1, _record(b"not json")),
        error,
        _reply(2, _record(json.dumps({"learner": {}}).encode())),
        _reply(4, _record(_model([7.0]))),
        _reply(5, ArrayRecord({"0": np.zeros(1, np.uint8), "1": np.zeros(1, np.uint8)})),
    ]
    with caplog.at_level(logging.WARNING, logger="fedcore.strategy"):
        arrays, metrics = _bag(FedXgbBagging(), _record(_model([1.0])), replies)

    assert json.loads(_bytes(arrays)) == json.loads(_model([1.0], [7.0]))
    assert metrics is not None
    assert dict(metrics) == {"auc": pytest.approx(0.4)}
    assert "not an XGBoost JSON model" in caplog.text
    assert "no learner.gradient_booster.model" in caplog.text
    assert "holds one array of model bytes, found 2" in caplog.text


def test_bagging_needs_one_array_to_send() -> None:
    with pytest.raises(ValueError, match="holds one array of model bytes, found 2"):
        FedXgbBagging().configure_train(
            1, ArrayRecord({"a": np.zeros(1), "b": np.zeros(1)}), ConfigRecord(), [1, 2]
        )


def test_bagging_real_boosters_predicts_the_sum_of_their_trees() -> None:
    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 4))
    labels = (features[:, 0] + 0.5 * features[:, 1] > 0).astype(float)
    parts = [
        xgb.DMatrix(features[:100], label=labels[:100]),
        xgb.DMatrix(features[100:], label=labels[100:]),
    ]
    everything = xgb.DMatrix(features)
    params = {"objective": "binary:logistic", "max_depth": 2, "eta": 0.3, "base_score": 0.5}

    def margin(booster: Any) -> np.ndarray:
        return np.asarray(booster.predict(everything, output_margin=True), dtype=np.float64)

    def load(model: bytes) -> Any:
        booster = xgb.Booster(params)
        booster.load_model(bytearray(model))
        return booster

    strategy = FedXgbBagging()
    # Round 1: each node boosts one round from nothing.
    local = [xgb.train(params, part, num_boost_round=1) for part in parts]
    replies = [_reply(i + 1, _record(bytes(b.save_raw("json")))) for i, b in enumerate(local)]
    arrays, _ = _bag(strategy, EMPTY, replies)
    bagged = load(_bytes(arrays))
    assert bagged.num_boosted_rounds() == 2
    # base_score 0.5 is a margin of 0: the bagged margin is the sum of the nodes' margins.
    np.testing.assert_allclose(margin(bagged), margin(local[0]) + margin(local[1]), rtol=1e-6)

    # Round 2: each node boosts the global model one round more and sends that round only.
    strategy.configure_train(2, arrays, ConfigRecord(), [1, 2])
    new_trees = []
    for part in parts:
        grown = xgb.train(params, part, num_boost_round=1, xgb_model=load(_bytes(arrays)))
        new_trees.append(grown[grown.num_boosted_rounds() - 1 : grown.num_boosted_rounds()])
    replies = [_reply(i + 1, _record(bytes(b.save_raw("json")))) for i, b in enumerate(new_trees)]
    arrays, _ = strategy.aggregate_train(2, replies)
    again = load(_bytes(arrays))
    assert again.num_boosted_rounds() == 4
    expected = margin(bagged) + margin(new_trees[0]) + margin(new_trees[1])
    np.testing.assert_allclose(margin(again), expected, rtol=1e-6)


# ------------------------------------------------------------------ FedXgbCyclic


def _targets(messages: list[Message]) -> list[int]:
    return [message.metadata.dst_node_id for message in messages]


def test_cyclic_gives_each_round_to_the_next_node_in_first_seen_order() -> None:
    strategy = FedXgbCyclic()
    model = _record(_model([1.0]))

    turns = [
        _targets(strategy.configure_train(r, model, ConfigRecord(), [5, 3, 9])) for r in range(1, 5)
    ]
    assert turns == [[5], [3], [9], [5]]
    # Node 1 joins, and the driver passes the ids in another order: the rota keeps
    # 5, 3, 9 and puts 1 last; round 5 is (5 − 1) mod 4 = 0 → node 5, round 6 → node 3.
    assert _targets(strategy.configure_train(5, model, ConfigRecord(), [9, 1, 3, 5])) == [5]
    assert _targets(strategy.configure_train(6, model, ConfigRecord(), [1, 9, 5, 3])) == [3]
    assert _targets(strategy.configure_train(8, model, ConfigRecord(), [1, 9, 5, 3])) == [1]
    assert _targets(strategy.configure_evaluate(2, model, ConfigRecord(), [3, 5])) == [3]


def test_cyclic_takes_the_nodes_model_as_the_new_global_model() -> None:
    strategy = FedXgbCyclic()
    grown = _record(_model([1.0], [2.0]))
    sent = Message(RecordDict(), 3, "train")
    replies = [Message(error=Error(2, "boom"), reply_to=sent), _reply(4, grown, n=7)]

    strategy.configure_train(1, _record(_model([1.0])), ConfigRecord(), [4, 3])
    arrays, metrics = strategy.aggregate_train(1, replies)

    assert arrays is grown
    assert metrics is not None
    assert dict(metrics) == {"auc": pytest.approx(0.4)}
    assert strategy.train_aggregation(1) is None


def test_cyclic_fractions_are_all_or_nothing() -> None:
    assert (
        FedXgbCyclic(fraction_evaluate=0.0).configure_evaluate(1, EMPTY, ConfigRecord(), [1, 2])
        == []
    )
    assert FedXgbCyclic().min_nodes("train") == 2
    with pytest.raises(
        ValueError, match=r"fraction_train must be 1\.0 or 0\.0 for FedXgbCyclic, got 0\.5"
    ):
        FedXgbCyclic(fraction_train=0.5)


@pytest.mark.parametrize("strategy", [FedXgbBagging(), FedXgbCyclic(min_available_nodes=3)])
def test_summary(strategy: FedXgbBagging) -> None:
    lines = strategy.summary().splitlines()
    assert lines[0] == type(strategy).__name__
    assert "├── fraction_train: 1.0" in lines
    assert "├── min_available_nodes: 3" in lines or isinstance(strategy, FedXgbBagging)
