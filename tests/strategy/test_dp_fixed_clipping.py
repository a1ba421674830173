"""Central DP with fixed clipping: clipped means by hand, noise by its formula, end to end."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.mods import fixedclipping_mod, message_stats_mod
from fedcore.strategy import FedAvg, FedBuff, Result, Strategy
from fedcore.strategy.dp_fixed_clipping import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from fedcore.testing.backends import backend_params

SENT = ArrayRecord({"w": np.zeros(2)})
Wrapper = (
    type[DifferentialPrivacyServerSideFixedClipping]
    | type[DifferentialPrivacyClientSideFixedClipping]
)
WRAPPERS = [DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping]


class ListMean(Strategy):
    """A strategy that takes its replies as a list: the unweighted mean of their arrays."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        content = RecordDict({"arrays": arrays, "config": config})
        return [Message(content, node_id, "train") for node_id in node_ids]

    def aggregate_train(
        self, server_round: int, replies: Sequence[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.seen.extend(replies)
        if not replies:
            return None, None
        mean = np.mean([reply.content["arrays"]["w"] for reply in replies], axis=0)
        return ArrayRecord({"w": mean}), MetricRecord({"replies": len(replies)})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, node_ids: Sequence[int]
    ) -> list[Message]:
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Sequence[Message]
    ) -> MetricRecord | None:
        return None


def _reply(node: int, w: list[float], n: int = 1) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    content = RecordDict(
        {"arrays": ArrayRecord({"w": np.array(w)}), "metrics": MetricRecord({"num-examples": n})}
    )
    reply = Message(content, reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _error(node: int) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    reply = Message(error=Error(2, "boom"), reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _aggregate(
    strategy: Strategy, replies: Sequence[Message], *, streaming: bool, server_round: int = 1
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """As the round driver does: fold replies in when the strategy streams, else a list."""
    strategy.configure_train(server_round, SENT, ConfigRecord(), [1, 2, 3])
    aggregation = strategy.train_aggregation(server_round) if streaming else None
    if aggregation is None:
        return strategy.aggregate_train(server_round, replies)
    for reply in replies:
        aggregation.add(reply)
    return aggregation.result()


# Node 1's update (3, 4) has norm 5 and is clipped to 2: (1.2, 1.6). Node 2's (0, 1) stays.
LONG_AND_SHORT = [_reply(1, [3.0, 4.0]), _reply(2, [0.0, 1.0])]


@pytest.mark.parametrize("streaming", [True, False])
def test_server_side_averages_clipped_updates(streaming: bool) -> None:
    strategy = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 2.0, 2)

    arrays, metrics = _aggregate(strategy, LONG_AND_SHORT, streaming=streaming)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [0.6, 1.3])  # ((1.2, 1.6) + (0, 1)) / 2
    assert metrics is not None
    assert LONG_AND_SHORT[0].content["arrays"]["w"].tolist() == [3.0, 4.0]  # replies unchanged


def test_server_side_streams_when_the_wrapped_strategy_does() -> None:
    assert DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0, 1, 1).train_aggregation(1)
    assert DifferentialPrivacyServerSideFixedClipping(ListMean(), 0, 1, 1).train_aggregation(1) is (
        None
    )


def test_server_side_wraps_a_list_based_strategy() -> None:
    inner = ListMean()
    strategy = DifferentialPrivacyServerSideFixedClipping(inner, 0.0, 2.0, 3)
    replies = [*LONG_AND_SHORT, _reply(3, [0.0, -8.0])]  # (0, -8) clipped to (0, -2)

    arrays, metrics = _aggregate(strategy, replies, streaming=True)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [0.4, 0.2])  # (1.2 + 0 + 0, 1.6 + 1 - 2) / 3
    assert metrics == MetricRecord({"replies": 3})
    assert [reply.metadata.src_node_id for reply in inner.seen] == [1, 2, 3]


def test_server_side_clips_relative_to_the_arrays_sent() -> None:
    strategy = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 1.0, 1)
    strategy.configure_train(1, ArrayRecord({"w": np.array([10.0, 10.0])}), ConfigRecord(), [1])

    arrays, _ = strategy.aggregate_train(1, [_reply(1, [13.0, 14.0])])

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [10.6, 10.8])
    assert strategy.current_arrays is not None


def test_server_side_skips_replies_it_cannot_clip(caplog: pytest.LogCaptureFixture) -> None:
    strategy = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 2.0, 2)

    with caplog.at_level(logging.WARNING, "fedcore.strategy"):
        arrays, _ = _aggregate(
            strategy, [_reply(1, [0.0, 1.0]), _reply(2, [1.0, 1.0, 1.0])], streaming=True
        )

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [0.0, 1.0])
    assert "reply from node 2 not aggregated: array 'w' has shape [3]" in caplog.text


def test_server_side_needs_configure_train_first() -> None:
    strategy = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 2.0, 2)
    with pytest.raises(RuntimeError, match="before configure_train"):
        strategy.aggregate_train(1, LONG_AND_SHORT)


def test_client_side_sends_the_norm_and_does_not_clip() -> None:
    strategy = DifferentialPrivacyClientSideFixedClipping(FedAvg(), 0.0, 2.0, 2)
    config = ConfigRecord({"lr": 0.1})

    messages = strategy.configure_train(4, SENT, config, [5, 6])

    assert [m.content["config"]["clipping_norm"] for m in messages] == [2.0, 2.0]
    assert messages[0].content["config"]["lr"] == 0.1
    assert messages[0].content["config"]["server-round"] == 4
    assert "clipping_norm" not in config
    arrays, _ = _aggregate(strategy, LONG_AND_SHORT, streaming=True)
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [1.5, 2.5])  # the plain mean: nodes clip, not us


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("streaming", [True, False])
def test_error_replies_are_never_aggregated(
    wrapper: Wrapper, streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    inner = ListMean()
    strategy = wrapper(inner if not streaming else FedAvg(), 0.0, 10.0, 3)
    replies = [_error(1), *LONG_AND_SHORT, _error(3)]

    with caplog.at_level(logging.WARNING, "fedcore.strategy"):
        arrays, _ = _aggregate(strategy, replies, streaming=streaming)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [1.5, 2.5])
    if not streaming:
        assert all(reply.has_content() for reply in inner.seen)
    assert "2 replies aggregated, but the noise is calibrated to num_sampled_clients=3" in (
        caplog.text
    )


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_no_warning_when_the_count_matches(
    wrapper: Wrapper, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = wrapper(FedAvg(), 0.0, 10.0, 2)
    with caplog.at_level(logging.WARNING, "fedcore.strategy"):
        _aggregate(strategy, LONG_AND_SHORT, streaming=True)
    assert caplog.text == ""


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_nothing_to_aggregate_gets_no_noise(wrapper: Wrapper) -> None:
    strategy = wrapper(FedAvg(), 1.0, 1.0, 2, seed=0)
    assert _aggregate(strategy, [_error(1)], streaming=True) == (None, None)


# ------------------------------------------------------------------ noise


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("streaming", [True, False])
def test_noise_std_is_multiplier_times_norm_over_clients(wrapper: Wrapper, streaming: bool) -> None:
    z, clip, m = 1.5, 2.0, 4
    sent = ArrayRecord({"w": np.zeros(250)})
    rng = np.random.default_rng(99)
    replies = [_reply(node, list(rng.normal(0, 0.01, 250))) for node in range(1, m + 1)]
    noiseless = np.mean([reply.content["arrays"]["w"] for reply in replies], axis=0)
    samples = []
    for seed in range(200):
        strategy = wrapper(FedAvg() if streaming else ListMean(), z, clip, m, seed=seed)
        strategy.configure_train(1, sent, ConfigRecord(), [1, 2, 3, 4])
        aggregation = strategy.train_aggregation(1)
        if aggregation is None:
            arrays, _ = strategy.aggregate_train(1, replies)
        else:
            for reply in replies:
                aggregation.add(reply)
            arrays, _ = aggregation.result()
        assert arrays is not None
        samples.append(arrays["w"] - noiseless)
    noise = np.array(samples)
    assert noise.std() == pytest.approx(z * clip / m, rel=0.02)
    assert abs(noise.mean()) < 0.01
    assert noise[:, 0].std() == pytest.approx(z * clip / m, rel=0.15)  # across seeds alone


def test_the_same_seed_gives_the_same_noise_per_round() -> None:
    def noised(seed: int | None, server_round: int) -> np.ndarray:
        strategy = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2, seed=seed)
        arrays, _ = _aggregate(strategy, LONG_AND_SHORT, streaming=True, server_round=server_round)
        assert arrays is not None
        return arrays["w"]

    np.testing.assert_array_equal(noised(5, 1), noised(5, 1))
    assert not np.array_equal(noised(5, 1), noised(6, 1))
    assert not np.array_equal(noised(5, 1), noised(5, 2))
    assert not np.array_equal(noised(None, 1), noised(None, 1))  # fresh entropy


# ------------------------------------------------------------------ delegation and arguments


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_evaluation_and_node_counts_are_the_wrapped_strategys(wrapper: Wrapper) -> None:
    inner = FedAvg(fraction_evaluate=0.5, min_evaluate_nodes=1, min_available_nodes=3)
    strategy = wrapper(inner, 1.0, 1.0, 2)
    evaluate = strategy.configure_evaluate(2, SENT, ConfigRecord(), [1, 2, 3, 4])
    assert [m.metadata.dst_node_id for m in evaluate] == [1, 2]
    assert strategy.min_nodes("train") == strategy.min_nodes("evaluate") == 3
    replies = [_reply(1, [0.0, 0.0], 1), _reply(2, [0.0, 0.0], 3)]
    replies[0].content["metrics"]["accuracy"] = 0.5
    replies[1].content["metrics"]["accuracy"] = 1.0
    metrics = strategy.aggregate_evaluate(2, replies)
    assert metrics is not None
    assert metrics["accuracy"] == pytest.approx(0.875)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"noise_multiplier": -0.5}, ValueError, r"noise_multiplier must be >= 0, got -0.5"),
        ({"clipping_norm": 0.0}, ValueError, r"clipping_norm must be > 0, got 0.0"),
        ({"num_sampled_clients": 0}, ValueError, r"num_sampled_clients must be an int >= 1"),
        ({"num_sampled_clients": 2.0}, TypeError, r"num_sampled_clients must be an int"),
        ({"seed": -1}, ValueError, r"seed must be an int >= 0, got -1"),
        ({"strategy": "FedAvg"}, TypeError, r"strategy must be a Strategy, got str"),
    ],
)
def test_bad_arguments(
    wrapper: Wrapper, arguments: dict[str, object], error: type[Exception], match: str
) -> None:
    options: dict[str, object] = {
        "strategy": FedAvg(),
        "noise_multiplier": 1.0,
        "clipping_norm": 1.0,
        "num_sampled_clients": 2,
    }
    with pytest.raises(error, match=match):
        wrapper(**{**options, **arguments})  # type: ignore[arg-type]


def test_repr_names_the_wrapped_strategy() -> None:
    text = repr(DifferentialPrivacyClientSideFixedClipping(FedAvg(), 1.0, 2.0, 3))
    assert text.startswith("DifferentialPrivacyClientSideFixedClipping(FedAvg(")
    assert text.endswith("noise_multiplier=1.0, clipping_norm=2.0, num_sampled_clients=3)")


# ------------------------------------------------------------------ end to end

DIMENSIONS = 4
dp_client = fc.ClientApp(mods=[message_stats_mod, fixedclipping_mod])


@dp_client.train()
def train(msg: fc.Message, context: fc.Context) -> fc.Message:
    """Moves far (10 × (i + 1)) along axis i mod 4: far beyond any small clipping norm."""
    partition = int(context.node_config["partition-id"])  # type: ignore[call-overload]
    step = np.zeros(DIMENSIONS)
    step[partition % DIMENSIONS] = 10.0 * (partition + 1)
    arrays = fc.ArrayRecord({"w": msg.content["arrays"]["w"] + step})
    metrics = fc.MetricRecord({"num-examples": 1})
    return fc.Message(fc.RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


async def _simulate(strategy: Strategy, nodes: int, rounds: int, backend: str = "inline") -> Result:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        w0 = fc.ArrayRecord({"w": np.full(DIMENSIONS, 0.5)})
        return await strategy.start(grid=grid, initial_arrays=w0, num_rounds=rounds)

    app = fc.App(server=server, client=dp_client)
    result: Result = (await fc.simulate(app, nodes=nodes, seed=0, backend=backend)).value
    return result


def _fedavg(nodes: int) -> FedAvg:
    return FedAvg(min_train_nodes=nodes, min_available_nodes=nodes, fraction_evaluate=0.0)


@pytest.mark.anyio
@pytest.mark.parametrize("backend", backend_params())
async def test_simulation_with_client_side_clipping_respects_the_bound(backend: str) -> None:
    """Inline: the mods run in a worker thread; process: in ``handle_blocking``."""
    strategy = DifferentialPrivacyClientSideFixedClipping(_fedavg(4), 0.0, 1.0, 4)

    result = await _simulate(strategy, nodes=4, rounds=2, backend=backend)

    # Each node's update is clipped to a unit step along its own axis; the mean of the
    # four is 0.25 on every axis per round, of norm 0.5 <= the clipping norm of 1.
    np.testing.assert_allclose(result.arrays["w"], np.full(DIMENSIONS, 0.5 + 2 * 0.25))
    metrics = result.train_metrics_clientapp[2]  # message_stats_mod's, averaged by FedAvg
    array_bytes = DIMENSIONS * 8
    assert metrics["incoming-message-bytes"] > array_bytes  # type: ignore[operator]
    assert metrics["outgoing-message-bytes"] > array_bytes  # type: ignore[operator]
    assert metrics["handler-seconds"] >= 0  # type: ignore[operator]


@pytest.mark.anyio
async def test_simulation_with_client_side_clipping_and_noise() -> None:
    z, clip, m = 0.5, 1.0, 4
    noisy = DifferentialPrivacyClientSideFixedClipping(_fedavg(m), z, clip, m, seed=1)

    result = await _simulate(noisy, nodes=m, rounds=1)

    noise = result.arrays["w"] - np.full(DIMENSIONS, 0.75)
    expected = np.random.default_rng([1, 1]).normal(0.0, z * clip / m, DIMENSIONS)
    np.testing.assert_allclose(noise, expected)


def test_a_strategy_with_its_own_schedule_is_refused() -> None:
    with pytest.raises(TypeError, match="FedBuff runs its own schedule"):
        DifferentialPrivacyServerSideFixedClipping(FedBuff(), 1.0, 1.0, 10)
