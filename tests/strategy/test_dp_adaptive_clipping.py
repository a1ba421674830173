"""Central DP with adaptive clipping, against the update rule of Andrew et al. by hand.

Each expected norm below is the paper's geometric step written out,
C' = C · exp(−η (b̃ − γ)) with b̃ = (unclipped + N(0, σ_b²)) / n, and each expected
noise the paper's z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) times C / m — numbers computed here,
never by the code under test.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.mods import adaptiveclipping_mod
from fedcore.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    FedAvg,
    FedBuff,
    FedMedian,
    Result,
    Strategy,
)

SENT = ArrayRecord({"w": np.zeros(2)})
ServerSide = DifferentialPrivacyServerSideAdaptiveClipping
ClientSide = DifferentialPrivacyClientSideAdaptiveClipping


def _reply(node: int, w: Sequence[float], norm_bit: int | None = None) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    metrics = {"num-examples": 1} if norm_bit is None else {"num-examples": 1, "norm_bit": norm_bit}
    content = RecordDict(
        {"arrays": ArrayRecord({"w": np.array(w)}), "metrics": MetricRecord(metrics)}
    )
    reply = Message(content, reply_to=sent)
    reply.metadata.src_node_id = node
    return reply


def _error(node: int) -> Message:
    sent = Message(RecordDict(), node, "train")
    sent.metadata.message_id = f"m{node}"
    return Message(error=Error(2, "boom"), reply_to=sent)


def _train(
    strategy: Strategy, replies: Sequence[Message], *, streaming: bool, server_round: int = 1
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """As the round driver does: configure, then fold replies in or pass the list."""
    strategy.configure_train(server_round, SENT, ConfigRecord(), [1, 2, 3])
    aggregation = strategy.train_aggregation(server_round) if streaming else None
    if aggregation is None:
        return strategy.aggregate_train(server_round, replies)
    for reply in replies:
        aggregation.add(reply)
    return aggregation.result()


def _step(
    norm: float, unclipped: float, counted: int, lr: float = 0.2, target: float = 0.5
) -> float:
    return norm * math.exp(-lr * (unclipped / counted - target))


# Updates (3, 4), (0, 1), (0.6, 0.8): norms 5, 1, 1. With C = 2 the first is clipped.
THREE = [(3.0, 4.0), (0.0, 1.0), (0.6, 0.8)]


@pytest.mark.parametrize("streaming", [True, False])
def test_server_side_clips_then_moves_the_norm_by_the_unclipped_fraction(streaming: bool) -> None:
    strategy = ServerSide(FedAvg(), 0.0, 3, initial_clipping_norm=2.0)

    arrays, _ = _train(
        strategy, [_reply(i + 1, w) for i, w in enumerate(THREE)], streaming=streaming
    )

    assert arrays is not None
    # (3, 4) scaled by 2 / 5 to (1.2, 1.6); the mean of the three:
    np.testing.assert_allclose(arrays["w"], [(1.2 + 0.0 + 0.6) / 3, (1.6 + 1.0 + 0.8) / 3])
    # two of three under C: b = 2/3 > γ = 1/2, so C shrinks by exp(−0.2 (2/3 − 1/2)).
    assert strategy.clipping_norm == pytest.approx(2.0 * math.exp(-0.2 * (2 / 3 - 0.5)))


def test_server_side_clips_round_two_with_the_norm_round_one_left() -> None:
    strategy = ServerSide(FedAvg(), 0.0, 2, initial_clipping_norm=1.0, clip_norm_lr=0.5)
    both_long = [_reply(1, [3.0, 4.0]), _reply(2, [0.0, 10.0])]

    _train(strategy, both_long, streaming=True, server_round=1)
    after_one = 1.0 * math.exp(-0.5 * (0.0 - 0.5))  # none unclipped: C grows by e^0.25
    assert strategy.clipping_norm == pytest.approx(after_one)
    arrays, _ = _train(strategy, both_long, streaming=True, server_round=2)

    assert arrays is not None
    # each update scaled to length after_one: (0.6, 0.8)·C and (0, 1)·C
    np.testing.assert_allclose(arrays["w"], [0.3 * after_one, 0.9 * after_one])
    assert strategy.clipping_norm == pytest.approx(after_one * math.exp(0.25))


def test_the_norm_converges_to_the_target_quantile_of_the_norms() -> None:
    """Ten updates of norms 1..10, γ = 0.7: C settles between the 7th and 8th norm."""
    strategy = ServerSide(FedAvg(), 0.0, 10, initial_clipping_norm=0.1, target_clipped_quantile=0.7)
    replies = [_reply(n, [float(n), 0.0]) for n in range(1, 11)]

    for server_round in range(1, 201):
        _train(strategy, replies, streaming=True, server_round=server_round)

    assert 7.0 <= strategy.clipping_norm < 8.0


def test_noise_uses_the_papers_split_of_the_budget_and_the_rounds_norm() -> None:
    z, sigma_b, m, c0, seed = 1.0, 1.0, 3, 2.0, 11
    strategy = ServerSide(
        FedAvg(), z, m, initial_clipping_norm=c0, clipped_count_stddev=sigma_b, seed=seed
    )

    arrays, _ = _train(strategy, [_reply(i + 1, w) for i, w in enumerate(THREE)], streaming=True)

    z_delta = (z**-2 - (2 * sigma_b) ** -2) ** -0.5  # 1 / sqrt(3/4)
    assert strategy.noise_multiplier == pytest.approx(2 / math.sqrt(3))
    expected_noise = np.random.default_rng([seed, 1]).normal(0.0, z_delta * c0 / m, 2)
    assert arrays is not None
    mean = np.array([(1.2 + 0.0 + 0.6) / 3, (1.6 + 1.0 + 0.8) / 3])
    np.testing.assert_allclose(arrays["w"] - mean, expected_noise)
    count_noise = np.random.default_rng([seed, 1, 1]).normal(0.0, sigma_b)
    assert strategy.clipping_norm == pytest.approx(_step(c0, 2 + count_noise, 3))


def test_the_count_noise_defaults_to_a_twentieth_of_the_sampled_nodes() -> None:
    strategy = ServerSide(FedAvg(), 1.0, 60)  # σ_b = 3: z_Δ = (1 − 1/36)^(−1/2)
    assert strategy.clipped_count_stddev == 3.0
    assert strategy.noise_multiplier == pytest.approx((1 - 1 / 36) ** -0.5)
    quiet = ServerSide(FedAvg(), 0.0, 60)
    assert (quiet.clipped_count_stddev, quiet.noise_multiplier) == (0.0, 0.0)
    with pytest.raises(ValueError, match=r"noise_multiplier \(1.0\) must be below 2 × clipped"):
        ServerSide(FedAvg(), 1.0, 10)  # σ_b = 0.5: 2σ_b = 1 is not above z


def test_server_side_counts_neither_errors_nor_replies_it_cannot_clip(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = ServerSide(FedAvg(min_train_nodes=1), 0.0, 2, initial_clipping_norm=2.0)
    replies = [_reply(1, [3.0, 4.0]), _error(2), _reply(3, [np.nan, 0.0])]

    with caplog.at_level(logging.WARNING, logger="fedcore.strategy"):
        arrays, _ = _train(strategy, replies, streaming=False)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [1.2, 1.6])
    assert strategy.clipping_norm == pytest.approx(_step(2.0, 0, 1))  # one counted, clipped
    assert "non-finite" in caplog.text


def test_server_side_wraps_a_list_based_strategy() -> None:
    strategy = ServerSide(FedMedian(), 0.0, 3, initial_clipping_norm=2.0)

    arrays, _ = _train(strategy, [_reply(i + 1, w) for i, w in enumerate(THREE)], streaming=True)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [0.6, 1.0])  # medians of (1.2, 0, 0.6), (1.6, 1, 0.8)
    assert strategy.clipping_norm == pytest.approx(_step(2.0, 2, 3))


def test_client_side_sends_the_norm_and_moves_it_by_the_nodes_bits() -> None:
    strategy = ClientSide(FedAvg(), 0.0, 3, initial_clipping_norm=0.5, clip_norm_lr=0.3)

    messages = strategy.configure_train(1, SENT, ConfigRecord({"lr": 0.1}), [1, 2, 3])
    assert {m.content["config"]["clipping_norm"] for m in messages} == {0.5}
    replies = [
        _reply(1, [0.3, 0.4], norm_bit=1),
        _reply(2, [0.1, 0.0], 0),
        _reply(3, [0.0, 0.2], 1),
    ]
    arrays, _ = strategy.aggregate_train(1, replies)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [0.4 / 3, 0.6 / 3])  # the server does not clip
    assert strategy.clipping_norm == pytest.approx(0.5 * math.exp(-0.3 * (1 / 3 - 0.5)))
    following = strategy.configure_train(2, SENT, ConfigRecord(), [1])
    assert following[0].content["config"]["clipping_norm"] == strategy.clipping_norm


def test_client_side_leaves_out_replies_without_a_bit(caplog: pytest.LogCaptureFixture) -> None:
    strategy = ClientSide(FedAvg(min_train_nodes=1), 0.0, 2, initial_clipping_norm=1.0)
    replies = [_reply(1, [1.0, 1.0], norm_bit=0), _reply(2, [9.0, 9.0]), _reply(3, [5.0, 5.0], 2)]

    with caplog.at_level(logging.WARNING, logger="fedcore.strategy"):
        arrays, _ = _train(strategy, replies, streaming=True)

    assert arrays is not None
    np.testing.assert_allclose(arrays["w"], [1.0, 1.0])
    assert strategy.clipping_norm == pytest.approx(_step(1.0, 1, 1))
    assert caplog.text.count("adaptiveclipping_mod in the ClientApp's mods") == 2


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier must be >= 0"),
        ({"num_sampled_clients": 0}, "num_sampled_clients must be an int >= 1"),
        ({"initial_clipping_norm": 0.0}, "initial_clipping_norm must be > 0"),
        ({"target_clipped_quantile": 1.5}, "target_clipped_quantile must be a number between"),
        ({"clip_norm_lr": 0.0}, "clip_norm_lr must be > 0"),
        ({"clipped_count_stddev": -1.0}, "clipped_count_stddev must be >= 0"),
    ],
)
def test_bad_arguments(arguments: dict[str, float], error: str) -> None:
    options: dict[str, float] = {"noise_multiplier": 0.0, "num_sampled_clients": 2, **arguments}
    for wrapper in (ServerSide, ClientSide):
        with pytest.raises(ValueError, match=error):
            wrapper(FedAvg(), **options)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FedBuff runs its own schedule"):
        ServerSide(FedBuff(), 0.0, 2)


def test_summary_names_the_settings_and_the_current_norm() -> None:
    strategy = ClientSide(FedAvg(), 0.0, 3, initial_clipping_norm=2.0)
    strategy.configure_train(1, SENT, ConfigRecord(), [1, 2, 3])
    strategy.aggregate_train(1, [_reply(n, [0.0, 0.0], norm_bit=0) for n in (1, 2, 3)])

    lines = strategy.summary().splitlines()

    assert lines[0] == "DifferentialPrivacyClientSideAdaptiveClipping"
    assert "├── strategy: FedAvg" in lines
    assert "├── initial_clipping_norm: 2.0" in lines
    assert "├── target_clipped_quantile: 0.5" in lines
    assert lines[-1] == f"└── clipping_norm: {_step(2.0, 3, 3)!r}"


# ------------------------------------------------------------------ end to end

DIMENSIONS = 4


def _client(*mods: Any) -> fc.ClientApp:
    client = fc.ClientApp(mods=list(mods))

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        """Moves 10 × (i + 1) along axis i mod 4: beyond any norm these runs reach."""
        partition = int(context.node_config["partition-id"])  # type: ignore[call-overload]
        step = np.zeros(DIMENSIONS)
        step[partition % DIMENSIONS] = 10.0 * (partition + 1)
        arrays = fc.ArrayRecord({"w": msg.content["arrays"]["w"] + step})
        metrics = fc.MetricRecord({"num-examples": 1})
        return fc.Message(fc.RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return client


async def _simulate(strategy: Strategy, client: fc.ClientApp, rounds: int) -> Result:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        w0 = fc.ArrayRecord({"w": np.full(DIMENSIONS, 0.5)})
        return await strategy.start(grid=grid, initial_arrays=w0, num_rounds=rounds)

    app = fc.App(server=server, client=client)
    result: Result = (await fc.simulate(app, nodes=4, seed=0, backend="inline")).value
    return result


@pytest.mark.anyio
@pytest.mark.parametrize("side", ["server", "client"])
async def test_simulation_follows_the_norm_round_by_round(side: str) -> None:
    fedavg = FedAvg(min_train_nodes=4, min_available_nodes=4, fraction_evaluate=0.0)
    if side == "server":
        strategy: Strategy = ServerSide(fedavg, 0.0, 4, initial_clipping_norm=1.0)
        client = _client()
    else:
        strategy = ClientSide(fedavg, 0.0, 4, initial_clipping_norm=1.0)
        client = _client(adaptiveclipping_mod)

    result = await _simulate(strategy, client, rounds=3)

    # Every update is clipped every round, so none is under C and C grows by
    # exp(0.2 × 0.5) each round; each round adds C/4 along every axis (four unit
    # steps, one per axis, each of length C, averaged).
    norms = [1.0 * math.exp(0.1) ** r for r in range(3)]
    np.testing.assert_allclose(result.arrays["w"], np.full(DIMENSIONS, 0.5 + sum(norms) / 4))
    assert strategy.clipping_norm == pytest.approx(math.exp(0.1) ** 3)  # type: ignore[attr-defined]
    if side == "client":
        assert result.train_metrics_clientapp[3]["norm_bit"] == 1.0
