"""Flower's legacy strategies (fedcore.legacy.strategy) against fedcore's Message-API ones.

Each legacy strategy with a Message-API twin must give the same aggregate for the same
replies, bit for bit: both call the one implementation of the rule. And legacy
FedAvg's callbacks are used as Flower's legacy server uses them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from fedcore import ArrayRecord, Message, MetricRecord, RecordDict
from fedcore import strategy as message_api
from fedcore.legacy import strategy as legacy
from fedcore.legacy.client_manager import SimpleClientManager
from fedcore.legacy.client_proxy import ClientProxy
from fedcore.legacy.types import (
    Code,
    EvaluateRes,
    FitRes,
    Metrics,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

NDArrays = list[np.ndarray]


class _Proxy(ClientProxy):
    """A client the strategy can sample; the strategy never calls it."""

    def _unused(self, *args: object) -> Any:
        raise AssertionError("a strategy does not call its clients")

    get_properties = get_parameters = fit = evaluate = reconnect = _unused


def _models(count: int, seed: int = 0) -> list[NDArrays]:
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5)] for _ in range(count)]


def _fit_results(
    models: Sequence[NDArrays], counts: Sequence[int], loss: float = 0.5
) -> list[tuple[ClientProxy, FitRes]]:
    return [
        (
            _Proxy(str(i)),
            FitRes(Status(Code.OK, ""), ndarrays_to_parameters(m), n, {"train_loss": loss}),
        )
        for i, (m, n) in enumerate(zip(models, counts, strict=True))
    ]


def _replies(models: Sequence[NDArrays], counts: Sequence[int], loss: float = 0.5) -> list[Message]:
    replies = []
    for node, (model, count) in enumerate(zip(models, counts, strict=True), start=1):
        sent = Message(RecordDict(), node, "train")
        content = RecordDict(
            {
                "arrays": ArrayRecord(list(model)),
                "metrics": MetricRecord({"num-examples": count, "train_loss": loss}),
            }
        )
        reply = Message(content, reply_to=sent)
        reply.metadata.src_node_id = node
        replies.append(reply)
    return replies


def _legacy_round(
    strategy: legacy.Strategy, server_round: int, models: list[NDArrays], counts: list[int]
) -> NDArrays:
    parameters, _ = strategy.aggregate_fit(server_round, _fit_results(models, counts), [])
    assert parameters is not None
    return parameters_to_ndarrays(parameters)


def _message_round(
    strategy: message_api.FedAvg, server_round: int, models: list[NDArrays], counts: list[int]
) -> NDArrays:
    arrays, _ = strategy.aggregate_train(server_round, _replies(models, counts))
    assert arrays is not None
    return [np.asarray(arrays[key]) for key in arrays]


def _assert_same(ours: NDArrays, theirs: NDArrays) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


COUNTS = [3, 1, 4, 1, 5, 9, 2]

TWINS: dict[str, tuple[Callable[[], legacy.Strategy], Callable[[], message_api.FedAvg]]] = {
    "FedAvg": (legacy.FedAvg, message_api.FedAvg),
    "FedAvg-not-inplace": (lambda: legacy.FedAvg(inplace=False), message_api.FedAvg),
    "FaultTolerantFedAvg": (legacy.FaultTolerantFedAvg, message_api.FedAvg),
    "FedProx": (lambda: legacy.FedProx(proximal_mu=0.1), lambda: message_api.FedProx(0.1)),
    "FedMedian": (legacy.FedMedian, message_api.FedMedian),
    "FedTrimmedAvg": (
        lambda: legacy.FedTrimmedAvg(beta=0.2),
        lambda: message_api.FedTrimmedAvg(beta=0.2),
    ),
    "Krum": (
        lambda: legacy.Krum(num_malicious_clients=1),
        lambda: message_api.Krum(num_malicious_nodes=1),
    ),
    "MultiKrum": (
        lambda: legacy.Krum(num_malicious_clients=1, num_clients_to_keep=3),
        lambda: message_api.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3),
    ),
    "Bulyan": (
        lambda: legacy.Bulyan(num_malicious_clients=1),
        lambda: message_api.Bulyan(num_malicious_nodes=1),
    ),
}


@pytest.mark.parametrize("name", sorted(TWINS))
def test_a_legacy_strategy_aggregates_as_its_message_api_twin(name: str) -> None:
    make_legacy, make_message = TWINS[name]
    models = _models(len(COUNTS))

    _assert_same(
        _legacy_round(make_legacy(), 1, models, COUNTS),
        _message_round(make_message(), 1, models, COUNTS),
    )


def _initial() -> NDArrays:
    return [np.zeros((3, 4), np.float32), np.full(5, 0.25)]


OPTIMIZERS: dict[str, tuple[Callable[..., legacy.FedAvg], Callable[[], message_api.FedAvg]]] = {
    "FedAvgM": (
        lambda p: legacy.FedAvgM(
            initial_parameters=p, server_learning_rate=0.5, server_momentum=0.9
        ),
        lambda: message_api.FedAvgM(server_learning_rate=0.5, server_momentum=0.9),
    ),
    "FedAdam": (
        lambda p: legacy.FedAdam(initial_parameters=p, eta=0.3, tau=1e-3),
        lambda: message_api.FedAdam(eta=0.3, tau=1e-3),
    ),
    "FedYogi": (
        lambda p: legacy.FedYogi(initial_parameters=p, eta=0.3, tau=1e-3),
        lambda: message_api.FedYogi(eta=0.3, tau=1e-3),
    ),
    "FedAdagrad": (
        lambda p: legacy.FedAdagrad(initial_parameters=p, eta=0.3, tau=1e-3),
        lambda: message_api.FedAdagrad(eta=0.3, tau=1e-3),
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_legacy_server_optimizer_steps_as_its_message_api_twin(name: str) -> None:
    """Three rounds, so the kept momentum or moments matter."""
    make_legacy, make_message = OPTIMIZERS[name]
    ours = make_legacy(ndarrays_to_parameters(_initial()))
    theirs = make_message()
    model = _initial()
    for server_round in (1, 2, 3):
        models = _models(4, seed=server_round)
        theirs.current_arrays = ArrayRecord(list(model))
        expected = _message_round(theirs, server_round, models, COUNTS[:4])
        _assert_same(_legacy_round(ours, server_round, models, COUNTS[:4]), expected)
        model = expected


def test_legacy_qfedavg_takes_the_q_ffl_step_of_fedcores() -> None:
    """Flower's legacy QFedAvg weighs every client by the server-side loss; with each
    node reporting that loss, fedcore's q-FedAvg takes the same step."""
    initial = _initial()
    models = _models(4)
    ours = legacy.QFedAvg(
        q_param=0.5, qffl_learning_rate=0.1, evaluate_fn=lambda rnd, weights, config: (0.7, {})
    )
    manager = SimpleClientManager()
    for cid in "abcd":
        manager.register(_Proxy(cid))
    ours.configure_fit(1, ndarrays_to_parameters(initial), manager)
    theirs = message_api.QFedAvg(client_learning_rate=0.1, q=0.5)
    theirs.current_arrays = ArrayRecord(list(initial))

    arrays, _ = theirs.aggregate_train(1, _replies(models, COUNTS[:4], loss=0.7))

    assert arrays is not None
    _assert_same(
        _legacy_round(ours, 1, models, COUNTS[:4]), [np.asarray(arrays[k]) for k in arrays]
    )


def test_legacy_qfedavg_without_evaluate_fn_is_refused() -> None:
    strategy = legacy.QFedAvg()
    manager = SimpleClientManager()
    for cid in "ab":
        manager.register(_Proxy(cid))
    strategy.configure_fit(1, ndarrays_to_parameters(_initial()), manager)

    with pytest.raises(ValueError, match="evaluate_fn"):
        strategy.aggregate_fit(1, _fit_results(_models(2), [1, 1]), [])


# ---- legacy FedAvg's callbacks, as Flower's legacy server calls them


def _manager(count: int) -> SimpleClientManager:
    manager = SimpleClientManager()
    for cid in range(count):
        manager.register(_Proxy(str(cid)))
    return manager


def test_initial_parameters_are_handed_over_once() -> None:
    initial = ndarrays_to_parameters(_initial())
    strategy = legacy.FedAvg(initial_parameters=initial)

    assert strategy.initialize_parameters(_manager(2)) is initial
    assert strategy.initialize_parameters(_manager(2)) is None


def test_on_fit_config_fn_configures_every_sampled_client_each_round() -> None:
    rounds: list[int] = []

    def fit_config(server_round: int) -> dict[str, Any]:
        rounds.append(server_round)
        return {"lr": 0.1 * server_round, "epochs": 2}

    strategy = legacy.FedAvg(
        fraction_fit=0.5,
        min_fit_clients=3,
        on_fit_config_fn=fit_config,
        on_evaluate_config_fn=lambda r: {"batch": r},
    )
    parameters = ndarrays_to_parameters(_initial())

    fit = strategy.configure_fit(3, parameters, _manager(10))
    evaluate = strategy.configure_evaluate(4, parameters, _manager(10))

    assert rounds == [3]
    assert len(fit) == 5  # max(int(10 × 0.5), 3)
    assert len({proxy.cid for proxy, _ in fit}) == 5
    assert all(ins.config == {"lr": pytest.approx(0.3), "epochs": 2} for _, ins in fit)
    assert all(ins.parameters is parameters for _, ins in fit)
    assert [ins.config for _, ins in evaluate] == [{"batch": 4}] * 10


def test_evaluate_fn_gets_the_round_the_arrays_and_an_empty_config() -> None:
    calls: list[tuple[int, NDArrays, dict[str, Any]]] = []

    def evaluate_fn(server_round: int, weights: NDArrays, config: dict[str, Any]) -> Any:
        calls.append((server_round, weights, config))
        return 0.25, {"accuracy": 0.9}

    strategy = legacy.FedAvg(evaluate_fn=evaluate_fn)

    result = strategy.evaluate(7, ndarrays_to_parameters(_initial()))

    assert result == (0.25, {"accuracy": 0.9})
    ((server_round, weights, config),) = calls
    assert (server_round, config) == (7, {})
    _assert_same(weights, _initial())
    assert legacy.FedAvg().evaluate(1, ndarrays_to_parameters(_initial())) is None


def test_metrics_aggregation_fns_get_num_examples_and_metrics_pairs() -> None:
    seen: list[list[tuple[int, Metrics]]] = []

    def weighted_accuracy(pairs: list[tuple[int, Metrics]]) -> Metrics:
        seen.append(pairs)
        total = sum(n for n, _ in pairs)
        return {"accuracy": sum(n * float(m["accuracy"]) for n, m in pairs) / total}

    strategy = legacy.FedAvg(
        fit_metrics_aggregation_fn=weighted_accuracy,
        evaluate_metrics_aggregation_fn=weighted_accuracy,
    )
    fit_results = _fit_results(_models(2), [1, 3])
    fit_results[0][1].metrics = {"accuracy": 0.2}
    fit_results[1][1].metrics = {"accuracy": 0.6}
    evaluate_results = [
        (_Proxy("a"), EvaluateRes(Status(Code.OK, ""), 2.0, 1, {"accuracy": 1.0})),
        (_Proxy("b"), EvaluateRes(Status(Code.OK, ""), 1.0, 3, {"accuracy": 0.0})),
    ]

    _, fit_metrics = strategy.aggregate_fit(1, fit_results, [])
    loss, evaluate_metrics = strategy.aggregate_evaluate(1, evaluate_results, [])

    assert seen[0] == [(1, {"accuracy": 0.2}), (3, {"accuracy": 0.6})]
    assert fit_metrics == {"accuracy": pytest.approx(0.5)}
    assert loss == pytest.approx(1.25)
    assert evaluate_metrics == {"accuracy": pytest.approx(0.25)}


def test_without_aggregation_fns_metrics_are_empty_and_flower_warns_in_round_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = legacy.FedAvg()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, first = strategy.aggregate_fit(1, _fit_results(_models(2), [1, 1]), [])
        _, second = strategy.aggregate_fit(2, _fit_results(_models(2), [1, 1]), [])

    assert first == second == {}
    assert [r.getMessage() for r in caplog.records] == ["No fit_metrics_aggregation_fn provided"]


def test_failures_stop_aggregation_only_when_not_accepted() -> None:
    results = _fit_results(_models(2), [1, 1])
    failures: list[tuple[ClientProxy, FitRes] | BaseException] = [RuntimeError("lost")]

    refused, _ = legacy.FedAvg(accept_failures=False).aggregate_fit(1, results, failures)
    accepted, _ = legacy.FedAvg().aggregate_fit(1, results, failures)

    assert refused is None
    assert isinstance(accepted, Parameters)


def test_min_available_clients_below_the_minimums_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="flwr"):
        legacy.FedAvg(min_fit_clients=5, min_available_clients=2)

    assert "min_available_clients" in caplog.text
    assert repr(legacy.FedAvg(accept_failures=False)) == "FedAvg(accept_failures=False)"


def test_integer_layers_keep_their_dtype() -> None:
    """A deliberate difference (docs/from-flower.md): Flower's legacy mean turns an
    integer layer into float64; fedcore's rule rounds it back to its integers."""
    (mean,) = legacy.aggregate.aggregate([([np.array([1, 2])], 1), ([np.array([2, 4])], 1)])

    assert mean.dtype == np.array([1]).dtype
    np.testing.assert_array_equal(mean, [2, 3])


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda p: legacy.FedAdam(initial_parameters=p, eta=0), "eta"),
        (lambda p: legacy.FedYogi(initial_parameters=p, eta_l=-1.0), "eta_l"),
        (lambda p: legacy.FedAdagrad(initial_parameters=p, tau=0), "tau"),
        (lambda p: legacy.FedAvgM(initial_parameters=p, server_momentum=1.0), "server_momentum"),
    ],
)
def test_server_optimizers_check_their_arguments_as_their_message_api_twins(
    make: Callable[[Parameters], object], argument: str
) -> None:
    # docs/from-flower.md: Flower's legacy classes take these and fail later.
    with pytest.raises(ValueError, match=f"^{argument} must be"):
        make(ndarrays_to_parameters([np.zeros(2)]))
