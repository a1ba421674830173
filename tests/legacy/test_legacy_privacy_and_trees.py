"""Flower's legacy DP wrappers and XGBoost strategies against fedcore's Message-API ones:
the same replies give the same aggregate (the same seeded noise included) and the same
adapted clipping norm, since both compute with fedcore's one implementation."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedcore import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from fedcore import strategy as message_api
from fedcore.legacy import strategy as legacy
from fedcore.legacy.client_manager import SimpleClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.types import (
    Code,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

NDArrays = list[np.ndarray]
COUNT = 4


class _Proxy(ClientProxy):
    def _unused(self, *args: object) -> Any:
        raise AssertionError("a strategy does not call its clients")

    get_properties = get_parameters = fit = evaluate = reconnect = _unused


def _manager() -> SimpleClientManager:
    manager = SimpleClientManager()
    for cid in range(COUNT):
        manager.register(_Proxy(str(cid)))
    return manager


def _initial() -> NDArrays:
    return [np.zeros((2, 3), np.float32), np.ones(4)]


def _models(scales: list[float]) -> list[NDArrays]:
    rng = np.random.default_rng(3)
    return [
        [(s * rng.normal(size=(2, 3))).astype(np.float32), 1 + s * rng.normal(size=4)]
        for s in scales
    ]


SCALES = [0.1, 0.2, 2.0, 3.0]  # two updates within a norm of 1, two beyond it
BITS = [0, 0, 1, 1]  # what adaptiveclipping_mod would report for them


def _results(models: list[NDArrays]) -> list[tuple[ClientProxy, FitRes]]:
    return [
        (_Proxy(str(i)), FitRes(Status(Code.OK, ""), ndarrays_to_parameters(m), 1, {"norm_bit": b}))
        for i, (m, b) in enumerate(zip(models, BITS, strict=True))
    ]


def _replies(models: list[NDArrays]) -> list[Message]:
    replies = []
    for node, (model, bit) in enumerate(zip(models, BITS, strict=True), start=1):
        sent = Message(RecordDict(), node, "train")
        content = RecordDict(
            {
                "arrays": ArrayRecord(list(model)),
                "metrics": MetricRecord({"num-examples": 1, "norm_bit": bit}),
            }
        )
        reply = Message(content, reply_to=sent)
        reply.metadata.src_node_id = node
        replies.append(reply)
    return replies


WRAPPERS: dict[
    str, tuple[Callable[[legacy.Strategy], Any], Callable[[message_api.FedAvg], Any]]
] = {
    "ServerSideFixed": (
        lambda s: legacy.DifferentialPrivacyServerSideFixedClipping(s, 0.5, 1.0, COUNT, seed=7),
        lambda s: message_api.DifferentialPrivacyServerSideFixedClipping(
            s, 0.5, 1.0, COUNT, seed=7
        ),
    ),
    "ClientSideFixed": (
        lambda s: legacy.DifferentialPrivacyClientSideFixedClipping(s, 0.5, 1.0, COUNT, seed=7),
        lambda s: message_api.DifferentialPrivacyClientSideFixedClipping(
            s, 0.5, 1.0, COUNT, seed=7
        ),
    ),
    "ServerSideAdaptive": (
        lambda s: legacy.DifferentialPrivacyServerSideAdaptiveClipping(
            s, 0.1, COUNT, initial_clipping_norm=1.0, seed=7
        ),
        lambda s: message_api.DifferentialPrivacyServerSideAdaptiveClipping(
            s, 0.1, COUNT, initial_clipping_norm=1.0, seed=7
        ),
    ),
    "ClientSideAdaptive": (
        lambda s: legacy.DifferentialPrivacyClientSideAdaptiveClipping(
            s, 0.1, COUNT, initial_clipping_norm=1.0, seed=7
        ),
        lambda s: message_api.DifferentialPrivacyClientSideAdaptiveClipping(
            s, 0.1, COUNT, initial_clipping_norm=1.0, seed=7
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_legacy_dp_wrapper_noises_and_clips_as_its_message_api_twin(name: str) -> None:
    make_legacy, make_message = WRAPPERS[name]
    ours, theirs = make_legacy(legacy.FedAvg()), make_message(message_api.FedAvg())
    models = _models(SCALES)

    instructions = ours.configure_fit(1, ndarrays_to_parameters(_initial()), _manager())
    theirs.configure_train(1, ArrayRecord(_initial()), ConfigRecord(), list(range(1, COUNT + 1)))
    parameters, _ = ours.aggregate_fit(1, _results(models), [])
    arrays, _ = theirs.aggregate_train(1, _replies(models))

    assert parameters is not None
    assert arrays is not None
    ours_arrays = parameters_to_ndarrays(parameters)
    for mine, expected in zip(ours_arrays, [np.asarray(arrays[k]) for k in arrays], strict=True):
        assert mine.dtype == expected.dtype
        np.testing.assert_array_equal(mine, expected)
    assert ours.clipping_norm == theirs.clipping_norm
    assert ours.noise_multiplier == theirs.noise_multiplier
    if name.startswith("ClientSide"):
        assert all(ins.config["clipping_norm"] == 1.0 for _, ins in instructions)
    if name.endswith("Adaptive"):
        assert ours.clipping_norm != 1.0  # it adapted, as the twin's did


def test_a_round_with_failures_is_not_aggregated_and_the_inner_strategy_is_used() -> None:
    inner = legacy.FedAvg(on_fit_config_fn=lambda r: {"epochs": r})
    wrapper = legacy.DifferentialPrivacyClientSideFixedClipping(inner, 0.0, 1.0, COUNT)

    (first, *_) = wrapper.configure_fit(2, ndarrays_to_parameters(_initial()), _manager())
    refused, _ = wrapper.aggregate_fit(1, _results(_models(SCALES)), [RuntimeError("lost")])

    assert first[1].config == {"epochs": 2, "clipping_norm": 1.0}
    assert refused is None


def test_dpfedavg_adaptive_noises_each_result_and_adapts_to_the_bits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="flwr"):
        strategy = legacy.DPFedAvgAdaptive(
            legacy.FedAvg(), COUNT, init_clip_norm=1.0, noise_multiplier=0.0
        )
    results = _results(_models(SCALES))
    for (_, res), bit in zip(results, [1, 1, 1, 0], strict=True):
        res.metrics = {"dpfedavg_norm_bit": bool(bit)}

    instructions = strategy.configure_fit(1, ndarrays_to_parameters(_initial()), _manager())
    parameters, _ = strategy.aggregate_fit(1, results, [])

    assert "DEPRECATED" in caplog.text
    assert instructions[0][1].config == {
        "dpfedavg_clip_norm": 1.0,
        "dpfedavg_adaptive_clip_enabled": True,
    }
    assert parameters is not None
    assert all(res.num_examples == 1 for _, res in results)
    # three of four unclipped against a target of one half: C · exp(−0.2 · 0.25)
    assert strategy.clip_norm == pytest.approx(np.exp(-0.2 * 0.25))


# ---- XGBoost


def _tree_model(*tags: float) -> bytes:
    trees = [{"id": i, "base_weights": [tag]} for i, tag in enumerate(tags)]
    model = {
        "learner": {
            "gradient_booster": {
                "model": {
                    "gbtree_model_param": {"num_trees": str(len(trees)), "num_parallel_tree": "1"},
                    "trees": trees,
                    "tree_info": [0] * len(trees),
                    "iteration_indptr": list(range(len(trees) + 1)),
                }
            }
        }
    }
    return json.dumps(model).encode()


def test_legacy_fedxgb_bagging_bags_as_fedcores() -> None:
    models = [_tree_model(1.0), _tree_model(2.0, 3.0), _tree_model(4.0)]
    ours = legacy.FedXgbBagging()
    results: list[tuple[ClientProxy, FitRes]] = [
        (_Proxy(str(i)), FitRes(Status(Code.OK, ""), Parameters([m], ""), 1, {}))
        for i, m in enumerate(models)
    ]
    theirs = message_api.FedXgbBagging()
    theirs.configure_train(1, ArrayRecord({"0": np.empty(0, np.uint8)}), ConfigRecord(), [1, 2, 3])
    replies = []
    for node, model in enumerate(models, start=1):
        sent = Message(RecordDict(), node, "train")
        content = RecordDict(
            {
                "arrays": ArrayRecord({"0": np.frombuffer(model, np.uint8)}),
                "metrics": MetricRecord({"num-examples": 1}),
            }
        )
        reply = Message(content, reply_to=sent)
        reply.metadata.src_node_id = node
        replies.append(reply)

    parameters, _ = ours.aggregate_fit(1, results, [])
    arrays, _ = theirs.aggregate_train(1, replies)

    assert parameters is not None
    assert arrays is not None
    (bagged,) = parameters.tensors
    assert json.loads(bagged) == json.loads(np.asarray(arrays["0"]).tobytes())
    assert ours.global_model == bagged


def test_legacy_fedxgb_cyclic_trains_one_client_a_round_in_turn() -> None:
    strategy = legacy.FedXgbCyclic(fraction_fit=1.0, min_fit_clients=COUNT)
    manager = _manager()
    parameters = Parameters([b""], "")

    picked = [strategy.configure_fit(r, parameters, manager) for r in (1, 2, 5)]
    model, _ = strategy.aggregate_fit(
        1,
        [(_Proxy("0"), FitRes(Status(Code.OK, ""), Parameters([_tree_model(1.0)], ""), 1, {}))],
        [],
    )

    assert [len(instructions) for instructions in picked] == [1, 1, 1]
    assert model is not None
    assert model.tensors == [_tree_model(1.0)]
    assert strategy.aggregate_evaluate(1, [], []) == (None, {})
