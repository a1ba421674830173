"""FedMedian, FedTrimmedAvg, Krum, MultiKrum and Bulyan, tested without a Grid."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from fedcore import ArrayRecord, Error, Message, MetricRecord, RecordDict
from fedcore.strategy.bulyan import Bulyan
from fedcore.strategy.fedavg import FedAvg
from fedcore.strategy.fedmedian import FedMedian
from fedcore.strategy.fedtrimmedavg import FedTrimmedAvg
from fedcore.strategy.krum import Krum
from fedcore.strategy.multikrum import MultiKrum


def _reply(node: int, w: Sequence[float], n: int = 1, **metrics: float) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": np.array(w, dtype=np.float64)}),
            "metrics": MetricRecord({"num-examples": n, **metrics}),
        }
    )
    reply = Message(content, reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _error(node: int) -> Message:
    sent = Message(RecordDict(), node, "train")
    return Message(error=Error(2, "boom"), reply_to=sent)


def _replies(rows: Sequence[Sequence[float]]) -> list[Message]:
    return [_reply(node, row, node) for node, row in enumerate(rows, start=1)]


def _interleave_errors(replies: list[Message]) -> list[Message]:
    mixed = [_error(100)]
    for node, reply in enumerate(replies, start=101):
        mixed += [reply, _error(node)]
    return mixed


def _arrays(strategy: FedAvg, replies: list[Message]) -> np.ndarray:
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    return arrays["w"]


# The same fixed inputs as the aggregation math's tests; see test_robust_aggregate.py.
KRUM = [[1, 1], [2, 1], [1, 3], [3, 3], [11, 11]]
BULYAN = [[0, 4], [1, 3], [2, 2], [5, 1], [7, 0], [13, 13], [1000, -1000]]

STRATEGIES: list[Callable[[], FedAvg]] = [
    FedMedian,
    FedTrimmedAvg,
    lambda: Krum(num_malicious_nodes=1),
    lambda: MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3),
    lambda: Bulyan(num_malicious_nodes=1),
]
IDS = ["FedMedian", "FedTrimmedAvg", "Krum", "MultiKrum", "Bulyan"]


def test_fedmedian_by_hand() -> None:
    replies = _replies([[1, 10], [2, 30], [9, 20], [4, 0]])
    arrays, metrics = FedMedian().aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], [3, 15])  # unweighted: (2 + 4) / 2, (10 + 20) / 2
    assert metrics == MetricRecord()  # the weight is excluded, nothing else was sent


def test_fedtrimmedavg_by_hand() -> None:
    replies = _replies([[1, -50], [2, 0], [3, 6], [4, 4], [100, 9]])
    # beta 0.2 of 5: cut 1 at each end. x: 2, 3, 4 → 3; y: 0, 4, 6 → 10/3.
    np.testing.assert_allclose(_arrays(FedTrimmedAvg(), replies), [3, 10 / 3])
    # beta 0.4 of 5: cut 2 at each end, the median.
    np.testing.assert_array_equal(_arrays(FedTrimmedAvg(beta=0.4), replies), [3, 4])


def test_krum_by_hand_returns_the_update_as_sent() -> None:
    # Scores with f = 1 (2 nearest others): 5, 6, 8, 9, 292 → the first.
    replies = [_reply(node, row, 3, loss=node) for node, row in enumerate(KRUM, start=1)]
    arrays, metrics = Krum(num_malicious_nodes=1).aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], [1, 1])
    assert metrics == MetricRecord({"loss": 1.0})  # the chosen reply's only

    tenths = [_reply(1, [0.1, 0.7], 3), _reply(2, [0.2, 0.7], 3), _reply(3, [9.0, 9.0], 3)]
    arrays, _ = Krum().aggregate_train(1, tenths)
    assert arrays is not None
    assert arrays["w"].tobytes() == np.array([0.1, 0.7]).tobytes()


def test_multikrum_by_hand_weighted_by_examples() -> None:
    # Examples 1..5 by position; the 2 best are A (1 example) and B (2 examples).
    replies = [_reply(node, row, node, loss=10 * node) for node, row in enumerate(KRUM, start=1)]
    strategy = MultiKrum(num_malicious_nodes=1, num_nodes_to_select=2)
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None
    assert metrics is not None
    np.testing.assert_allclose(arrays["w"], [5 / 3, 1])  # (1·1 + 2·2) / 3, (1·1 + 2·1) / 3
    assert metrics["loss"] == pytest.approx(50 / 3)  # (1·10 + 2·20) / 3
    # The 3 best add C (3 examples): ((1 + 4 + 3) / 6, (1 + 2 + 9) / 6).
    three = MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3)
    np.testing.assert_allclose(_arrays(three, replies), [8 / 6, 2])


def test_bulyan_by_hand() -> None:
    # f = 1, n = 7: iterative Krum selects A..E (θ = 5); then per coordinate the 3
    # values closest to the median: x 0 1 2 5 7 → 2, 1, 0 → 1; y 4 3 2 1 0 → 2, 3, 1 → 2.
    replies = [_reply(node, row, node, loss=node) for node, row in enumerate(BULYAN, start=1)]
    arrays, metrics = Bulyan(num_malicious_nodes=1).aggregate_train(1, replies)
    assert arrays is not None
    assert metrics is not None
    np.testing.assert_array_equal(arrays["w"], [1, 2])
    assert metrics["loss"] == pytest.approx(55 / 15)  # selected 1..5: Σ n² / Σ n


@pytest.mark.parametrize("make", STRATEGIES, ids=IDS)
def test_error_replies_are_excluded(make: Callable[[], FedAvg]) -> None:
    replies = _replies(BULYAN)
    clean_arrays, clean_metrics = make().aggregate_train(1, replies)
    arrays, metrics = make().aggregate_train(1, _interleave_errors(replies))
    assert arrays is not None
    assert clean_arrays is not None
    np.testing.assert_array_equal(arrays["w"], clean_arrays["w"])
    assert metrics == clean_metrics
    assert make().aggregate_train(1, [_error(1), _error(2)]) == (None, None)


@pytest.mark.parametrize("make", STRATEGIES, ids=IDS)
def test_malformed_replies_are_skipped_and_logged(
    make: Callable[[], FedAvg], caplog: pytest.LogCaptureFixture
) -> None:
    replies = _replies(BULYAN)
    wrong_shape = _reply(50, [1.0, 2.0, 3.0])
    with caplog.at_level(logging.WARNING):
        arrays, _ = make().aggregate_train(1, [*replies, wrong_shape])
    assert "node 50 not aggregated" in caplog.text
    assert arrays is not None
    np.testing.assert_array_equal(arrays["w"], _arrays(make(), replies))


HONEST = [
    [0.9, -0.2, 3.0],
    [1.1, -0.1, 2.8],
    [1.0, 0.0, 3.3],
    [1.3, -0.3, 2.9],
    [0.8, 0.1, 3.1],
    [1.2, -0.2, 3.2],
]


@pytest.mark.parametrize(
    ("make", "honest"),
    [
        (FedMedian, 4),
        (FedTrimmedAvg, 4),  # beta 0.2 of 5 cuts 1 at each end
        (lambda: Krum(num_malicious_nodes=1), 4),
        (lambda: MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3), 5),
        (lambda: Bulyan(num_malicious_nodes=1), 6),
    ],
    ids=IDS,
)
def test_a_planted_outlier_is_ignored(make: Callable[[], FedAvg], honest: int) -> None:
    rows = HONEST[:honest]
    results = []
    for magnitude in (1e3, 1e9):
        outlier = [magnitude, -magnitude, magnitude]
        # The outlier in the middle, so no rule can drop it for its position.
        with_outlier = [*rows[:2], outlier, *rows[2:]]
        results.append(_arrays(make(), _replies(with_outlier)))
    np.testing.assert_array_equal(results[0], results[1])
    low, high = np.min(rows, axis=0), np.max(rows, axis=0)
    assert np.all((low <= results[0]) & (results[0] <= high))


def test_krum_picks_an_honest_update() -> None:
    outlier = [1e6, 1e6, -1e6]
    chosen = _arrays(Krum(num_malicious_nodes=1), _replies([outlier, *HONEST[:4]]))
    assert any(np.array_equal(chosen, row) for row in HONEST[:4])


@pytest.mark.parametrize("make", STRATEGIES, ids=IDS)
def test_dtypes_are_kept(make: Callable[[], FedAvg]) -> None:
    replies = []
    for node, value in enumerate([1, 2, 4, 9, 3, 5, 7], start=1):
        reply = _reply(node, [0.0], 1)
        reply.content["arrays"] = ArrayRecord(
            {"f": np.array([value, -value], np.float32), "n": np.array([value, 2 * value])}
        )
        replies.append(reply)
    arrays, _ = make().aggregate_train(1, replies)
    assert arrays is not None
    assert arrays["f"].dtype == np.float32
    assert arrays["n"].dtype == np.int64


@pytest.mark.parametrize("make", STRATEGIES, ids=IDS)
def test_replies_are_aggregated_all_at_once(make: Callable[[], FedAvg]) -> None:
    assert make().train_aggregation(1) is None


def test_multikrum_with_fewer_replies_than_selected_averages_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MultiKrum(num_nodes_to_select=3)
    with caplog.at_level(logging.WARNING):
        mean = _arrays(strategy, _replies([[0.0, 3.0], [3.0, 0.0]]))
    np.testing.assert_allclose(mean, [2.0, 1.0])  # examples 1 and 2
    assert "fewer than num_nodes_to_select=3" in caplog.text


def test_multikrum_selection_of_no_examples_leaves_the_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replies = [_reply(node, [float(node)], 0, loss=1.0) for node in (1, 2, 3)]
    arrays, metrics = MultiKrum(num_nodes_to_select=2).aggregate_train(1, replies)
    assert arrays is None
    assert metrics == MetricRecord({"loss": 1.0})
    assert "weigh 0 examples" in caplog.text


def test_bulyan_skips_a_round_with_too_few_replies(caplog: pytest.LogCaptureFixture) -> None:
    replies = _replies(BULYAN[:6])
    with caplog.at_level(logging.WARNING, logger="fedcore.strategy"):
        arrays, metrics = Bulyan(num_malicious_nodes=1).aggregate_train(1, replies)
    assert arrays is None
    assert metrics is not None
    assert "4 × num_malicious_nodes + 3 = 7 valid replies (num_malicious_nodes=1), got 6" in (
        caplog.text
    )
    arrays, _ = Bulyan().aggregate_train(1, replies[:3])  # f = 0 needs 3
    assert arrays is not None


def test_bulyan_custom_selection_rule() -> None:
    seen: list[tuple[list[RecordDict], int, int]] = []

    def last(contents: list[RecordDict], malicious: int, count: int) -> list[RecordDict]:
        seen.append((contents, malicious, count))
        return contents[-count:]

    replies = _replies([[0.0], [1.0], [2.0], [3.0], [40.0]])
    strategy = Bulyan(selection_rule=last, arrayrecord_key="model")
    # f = 0: θ = β = 5, the plain mean of what the rule selected.
    np.testing.assert_array_equal(_arrays(strategy, replies), [9.2])
    ((contents, malicious, count),) = seen
    assert (malicious, count) == (0, 5)
    np.testing.assert_array_equal(contents[0]["model"]["w"], [0.0])
    assert contents[2]["metrics"]["num-examples"] == 3
    assert "selection_rule=last" in repr(strategy)


@pytest.mark.parametrize(
    "rule",
    [
        lambda contents, f, count: contents[:-1],
        lambda contents, f, count: [contents[0]] * count,
        lambda contents, f, count: [RecordDict(c) for c in contents],
    ],
    ids=["too few", "repeated", "not given"],
)
def test_bulyan_rejects_a_bad_selection(
    rule: Callable[[list[RecordDict], int, int], list[RecordDict]],
) -> None:
    with pytest.raises(ValueError, match="selection_rule must return 3 distinct contents"):
        Bulyan(selection_rule=rule).aggregate_train(1, _replies([[0.0], [1.0], [2.0]]))


def test_reprs() -> None:
    assert repr(FedMedian()) == (
        "FedMedian(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=2)"
    )
    assert repr(FedTrimmedAvg(beta=0.1)).endswith("min_available_nodes=2, beta=0.1)")
    assert repr(Krum(num_malicious_nodes=2)).endswith(
        "min_available_nodes=2, num_malicious_nodes=2)"
    )
    assert repr(MultiKrum(num_nodes_to_select=4)).endswith(
        "num_malicious_nodes=0, num_nodes_to_select=4)"
    )
    assert repr(Bulyan(num_malicious_nodes=1)).startswith("Bulyan(fraction_train=1.0,")
    assert repr(Bulyan(num_malicious_nodes=1)).endswith(
        "num_malicious_nodes=1, selection_rule=iterative_krum)"
    )


def test_flower_positional_order() -> None:
    # Flower 1.42 places the robust arguments right after min_available_nodes, except
    # beta and selection_rule, which come last.
    assert MultiKrum(1.0, 1.0, 2, 2, 2, 1, 3).num_nodes_to_select == 3
    assert Krum(1.0, 1.0, 2, 2, 2, 1, "n").weighted_by_key == "n"
    assert Bulyan(1.0, 1.0, 2, 2, 2, 1, "n").num_malicious_nodes == 1
    assert FedTrimmedAvg(1.0, 1.0, 2, 2, 2, "n", "a", "c", None, None, 0.3).beta == 0.3


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FedTrimmedAvg(beta=0.5), ValueError, r"beta must be in \[0, 0.5\), got 0.5"),
        (lambda: FedTrimmedAvg(beta=-0.01), ValueError, "got -0.01"),
        (
            lambda: FedTrimmedAvg(beta="0.2"),  # type: ignore[arg-type]
            TypeError,
            "beta must be a number, got str",
        ),
        (lambda: Krum(num_malicious_nodes=-1), ValueError, "num_malicious_nodes must be"),
        (lambda: MultiKrum(num_malicious_nodes=-2), ValueError, "got -2"),
        (lambda: MultiKrum(num_nodes_to_select=0), ValueError, "num_nodes_to_select must be"),
        (
            lambda: MultiKrum(num_nodes_to_select=1.5),  # type: ignore[arg-type]
            TypeError,
            "must be an int, got float",
        ),
        (lambda: Bulyan(num_malicious_nodes=-1), ValueError, "num_malicious_nodes must be"),
        (lambda: Bulyan(num_malicious_nodes=True), TypeError, "must be an int, got bool"),
        (lambda: FedMedian(fraction_train=2.0), ValueError, "fraction_train must be"),
    ],
)
def test_bad_arguments(make: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()
