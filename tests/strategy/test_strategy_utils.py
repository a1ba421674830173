"""Flower's ``strategy_utils`` helpers, fedcore's own: for strategies written the Flower way.

advanced-pytorch's ``CustomFedAvg.start`` calls ``log_strategy_start_info``; the others
are what a Flower strategy of one's own aggregates, checks and samples with. Each is
served at ``flwr.serverapp.strategy.strategy_utils`` (tests/apps/test_flower_imports.py)
and lives in fedcore's module for its concept. The expected numbers are worked out
here by hand, not by the code under test.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from fedcore.apps.grid import SyncGrid
from fedcore.errors import InconsistentRepliesError, NotEnoughNodesError
from fedcore.strategy.aggregate import aggregate_arrayrecords, aggregate_metricrecords
from fedcore.strategy.base import config_to_str, log_strategy_start_info
from fedcore.strategy.fedavg import validate_message_reply_consistency
from fedcore.strategy.sampling import sample_nodes


def _reply(w: list[float], examples: int, **metrics: Any) -> RecordDict:
    return RecordDict(
        {
            "arrays": ArrayRecord({"w": np.array(w, dtype=np.float32), "n": np.array([4])}),
            "metrics": MetricRecord({"num-examples": examples, **metrics}),
        }
    )


def _renamed(content: RecordDict, **names: str) -> RecordDict:
    """``content`` with the records named by the keywords' names given the values'."""
    return RecordDict({names.get(name, name): record for name, record in content.items()})


def test_aggregate_arrayrecords_weights_each_reply_by_its_metric() -> None:
    replies = [_reply([1.0, 2.0], 1), _reply([4.0, 8.0], 3)]

    mean = aggregate_arrayrecords(replies, "num-examples")

    # (1·[1, 2] + 3·[4, 8]) / 4 = [3.25, 6.5]; the integer array stays an integer array
    np.testing.assert_array_equal(mean["w"], np.array([3.25, 6.5], dtype=np.float32))
    assert mean["w"].dtype == np.float32
    assert mean["n"].tolist() == [4]
    assert mean["n"].dtype == np.array([4]).dtype


def test_aggregate_arrayrecords_takes_the_arrays_of_every_record_as_one() -> None:
    content = RecordDict(
        {
            "a": ArrayRecord({"x": np.array([2.0])}),
            "b": ArrayRecord({"y": np.array([6.0])}),
            "m": MetricRecord({"w": 1}),
        }
    )

    mean = aggregate_arrayrecords([content, content], "w")

    assert {key: array.tolist() for key, array in mean.items()} == {"x": [2.0], "y": [6.0]}


def test_aggregate_arrayrecords_refuses_a_reply_without_its_weight() -> None:
    with pytest.raises(ValueError, match=r"metric 'examples' must be a number, got None"):
        aggregate_arrayrecords([_reply([1.0], 1)], "examples")
    with pytest.raises(ValueError, match=r"weights must sum to a positive number, got 0\.0"):
        aggregate_arrayrecords([_reply([1.0], 0)], "num-examples")


def test_aggregate_metricrecords_is_the_weighted_mean_but_the_weight() -> None:
    replies = [
        _reply([0.0], 1, loss=1.0, per_class=[1.0, 0.0]),
        _reply([0.0], 3, loss=3.0, per_class=[0.0, 1.0]),
    ]

    mean = aggregate_metricrecords(replies, "num-examples")

    # loss (1·1 + 3·3) / 4 = 2.5; per_class element by element: [0.25, 0.75]
    assert mean == MetricRecord({"loss": 2.5, "per_class": [0.25, 0.75]})


def test_aggregate_metricrecords_counts_replies_that_all_weigh_nothing_equally() -> None:
    mean = aggregate_metricrecords(
        [_reply([0.0], 0, loss=1.0), _reply([0.0], 0, loss=2.0)], "num-examples"
    )

    assert mean == MetricRecord({"loss": 1.5})


def test_consistent_replies_pass_validation() -> None:
    validate_message_reply_consistency(
        [_reply([1.0], 2, loss=0.1), _reply([2.0], 3, loss=0.2)], "num-examples", True
    )


@pytest.mark.parametrize(
    ("replies", "check_arrays", "problem"),
    [
        (
            [_reply([1.0], 2), _reply([1.0], 2, loss=0.2)],
            False,
            "reply 1 has the metric record 'metrics' of ['loss', 'num-examples'], "
            "reply 0 'metrics' of ['num-examples']",
        ),
        (
            [_reply([1.0], 2), RecordDict({"metrics": MetricRecord({"num-examples": 1})})],
            True,
            "reply 1: expected one ArrayRecord, found 0",
        ),
        (
            [RecordDict({"metrics": MetricRecord({"num-examples": [1, 2]})})],
            False,
            "reply 0: metric 'num-examples' must be a non-negative number, got [1, 2]",
        ),
        ([RecordDict({"m": MetricRecord({"n": 1})})], False, "metric 'num-examples' must be"),
        (
            [
                _reply([1.0], 2),
                RecordDict(
                    {
                        "arrays": ArrayRecord({"v": np.zeros(1)}),
                        "metrics": MetricRecord({"num-examples": 2}),
                    }
                ),
            ],
            True,
            "reply 1 has the array record 'arrays' of ['v'], reply 0 'arrays' of ['n', 'w']",
        ),
        (
            [_reply([1.0], 2), _renamed(_reply([1.0], 2), arrays="model")],
            True,
            "reply 1 has the array record 'model' of ['n', 'w'], reply 0 'arrays' of ['n', 'w']",
        ),
        (
            [_reply([1.0], 2), _renamed(_reply([1.0], 2), metrics="my-metrics")],
            False,
            "reply 1 has the metric record 'my-metrics' of ['num-examples'], reply 0 'metrics'",
        ),
    ],
)
def test_inconsistent_replies_are_refused_with_the_reason(
    replies: list[RecordDict], check_arrays: bool, problem: str
) -> None:
    with pytest.raises(InconsistentRepliesError) as caught:
        validate_message_reply_consistency(replies, "num-examples", check_arrays)

    assert problem in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_different_arrays_pass_when_arrays_are_not_checked() -> None:
    other = RecordDict(
        {"a": ArrayRecord({"v": np.zeros(1)}), "metrics": MetricRecord({"num-examples": 2})}
    )

    validate_message_reply_consistency([_reply([1.0], 2), other], "num-examples", False)


def test_config_to_str_masks_bytes_as_flower_does() -> None:
    config = ConfigRecord({"lr": 0.1, "name": "a", "ks": [1, 2], "model": b"\x00" * 12})

    assert config_to_str(config) == "{'lr': 0.1, 'name': a, 'ks': [1, 2], 'model': <bytes>}"


def test_log_strategy_start_info_logs_what_a_run_starts_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    arrays = ArrayRecord({"w": np.zeros(2**18, dtype=np.float32)})  # 1 MiB, and the key

    with caplog.at_level(logging.INFO, logger="fedcore.strategy"):
        log_strategy_start_info(10, arrays, ConfigRecord({"lr": 0.1}), None)

    assert caplog.messages == [
        "├── rounds: 10",
        "├── arrays: 1 (1.00 MB)",
        "├── train config: {'lr': 0.1}",
        "└── evaluate config: (empty)",
    ]


@pytest.mark.anyio
async def test_sample_nodes_waits_for_enough_then_draws_from_the_runs_seed() -> None:
    def main(grid: SyncGrid, context: fc.Context) -> list[tuple[list[int], list[int]]]:
        return [sample_nodes(grid, 4, 3) for _ in range(3)]

    async def run(seed: int) -> list[tuple[list[int], list[int]]]:
        server = fc.ServerApp()
        server.main()(main)
        app = fc.App(server=server, client=fc.ClientApp())
        return (await fc.simulate(app, nodes=6, seed=seed, backend="inline")).value

    first, again = await run(1), await run(1)

    online = first[0][1]
    assert len(online) == 6
    for sampled, everyone in first:
        assert everyone == online
        assert len(set(sampled)) == 3
        assert set(sampled) <= set(online)
    assert first == again  # the same seed draws the same nodes, call for call
    assert len({tuple(sampled) for sampled, _ in first}) > 1  # each call draws anew


@pytest.mark.anyio
async def test_sample_nodes_refuses_to_block_the_event_loop() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> None:
        sample_nodes(grid, 1, 1)

    server = fc.ServerApp()
    server.main()(main)
    app = fc.App(server=server, client=fc.ClientApp())
    with pytest.raises(TypeError, match="sample_nodes was given an async Grid in the event loop"):
        await fc.simulate(app, nodes=2, seed=0, backend="inline")


@pytest.mark.anyio
async def test_sample_nodes_gives_up_after_its_timeout_where_flowers_waits_for_ever() -> None:
    def main(grid: SyncGrid, context: fc.Context) -> None:
        sample_nodes(grid, 5, 1, timeout=0.05)

    server = fc.ServerApp()
    server.main()(main)
    app = fc.App(server=server, client=fc.ClientApp())
    with pytest.raises(
        NotEnoughNodesError, match=r"waited 0\.05 s for 5 nodes; only 2 came online"
    ):
        await fc.simulate(app, nodes=2, seed=0, backend="inline")
