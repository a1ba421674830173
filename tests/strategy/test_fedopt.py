"""FedAdam, FedYogi and FedAdagrad (Reddi et al., 2021), driven as the round driver
drives them — configure_train, then the running aggregation — over two rounds, against
the paper's update rules written out here in plain numpy."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import fedcore as fc
from fedcore import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from fedcore.errors import AggregationError
from fedcore.strategy import Result
from fedcore.strategy.fedadagrad import FedAdagrad
from fedcore.strategy.fedadam import FedAdam
from fedcore.strategy.fedopt import FedOpt
from fedcore.strategy.fedyogi import FedYogi

pytestmark = pytest.mark.anyio

NODES = [21, 22, 23]
Update = tuple[dict[str, np.ndarray], int]


def _answer(sent: Message, arrays: dict[str, np.ndarray], n: int) -> Message:
    content = RecordDict(
        {"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": n})}
    )
    return Message(content, reply_to=sent)


def _round(
    strategy: FedOpt, server_round: int, arrays: ArrayRecord, updates: Sequence[Update | None]
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


def _two_rounds(strategy: FedOpt, *, errors: bool = False) -> ArrayRecord:
    arrays: ArrayRecord | None = ArrayRecord(X0)
    for server_round, (first, second) in enumerate(ROUNDS, start=1):
        assert arrays is not None
        updates = [first, None, second] if errors else [first, second]
        arrays = _round(strategy, server_round, arrays, updates)
    assert arrays is not None
    return arrays


X0 = {
    "w": np.array([0.5, -1.0, 2.0]),
    "b": np.array([[0.25]], dtype=np.float32),
    "steps": np.array([100], dtype=np.int64),
}


def _update(w: list[float], b: float, steps: int, n: int) -> Update:
    arrays = {"w": np.array(w), "b": np.array([[b]], np.float32), "steps": np.array([steps])}
    return arrays, n


ROUNDS = [
    (_update([1.0, -1.0, 1.0], 0.5, 103, 1), _update([0.0, -3.0, 2.0], 1.0, 104, 3)),
    (_update([2.0, 0.0, 2.5], 0.0, 106, 2), _update([1.0, 1.0, 2.5], 0.5, 108, 2)),
]


def _mean(updates: tuple[Update, Update], key: str) -> np.ndarray:
    (first, n1), (second, n2) = updates
    total = first[key].astype(np.float64) * n1 + second[key].astype(np.float64) * n2
    mean: np.ndarray = total / (n1 + n2)
    return mean


# The update rules of Reddi et al. (Algorithm 2), as (m, v, Δ, round) -> (m, v, step size).
Moments = tuple[np.ndarray, np.ndarray, float]
Rule = Callable[[np.ndarray, np.ndarray, np.ndarray, int], Moments]


def _adam(eta: float, b1: float, b2: float) -> Rule:
    def rule(m: np.ndarray, v: np.ndarray, d: np.ndarray, r: int) -> Moments:
        # Flower's bias correction counts t = round + 1.
        size = eta * math.sqrt(1 - b2 ** (r + 1)) / (1 - b1 ** (r + 1))
        return b1 * m + (1 - b1) * d, b2 * v + (1 - b2) * d * d, size

    return rule


def _yogi(eta: float, b1: float, b2: float) -> Rule:
    def rule(m: np.ndarray, v: np.ndarray, d: np.ndarray, r: int) -> Moments:
        return b1 * m + (1 - b1) * d, v - (1 - b2) * d * d * np.sign(v - d * d), eta

    return rule


def _adagrad(eta: float) -> Rule:
    def rule(m: np.ndarray, v: np.ndarray, d: np.ndarray, r: int) -> Moments:
        return d, v + d * d, eta

    return rule


def _expected(rule: Rule, tau: float, key: str) -> np.ndarray:
    x = X0[key].astype(np.float64)
    m = v = np.zeros_like(x)
    for r, updates in enumerate(ROUNDS, start=1):
        m, v, size = rule(m, v, _mean(updates, key) - x, r)
        x = x + size * m / (np.sqrt(v) + tau)
    return x


CASES: list[tuple[Callable[[], FedOpt], Rule, float]] = [
    (lambda: FedAdam(eta=0.2, beta_1=0.8, beta_2=0.9, tau=0.01), _adam(0.2, 0.8, 0.9), 0.01),
    (lambda: FedAdam(), _adam(0.1, 0.9, 0.99), 1e-3),
    (lambda: FedYogi(eta=0.3, beta_1=0.5, beta_2=0.7, tau=0.05), _yogi(0.3, 0.5, 0.7), 0.05),
    (lambda: FedYogi(), _yogi(1e-2, 0.9, 0.99), 1e-3),
    (lambda: FedAdagrad(eta=0.4, tau=0.1), _adagrad(0.4), 0.1),
    (lambda: FedAdagrad(), _adagrad(0.1), 1e-3),
]
IDS = ["adam", "adam-defaults", "yogi", "yogi-defaults", "adagrad", "adagrad-defaults"]


@pytest.mark.parametrize(("make", "rule", "tau"), CASES, ids=IDS)
def test_two_rounds_follow_the_paper(make: Callable[[], FedOpt], rule: Rule, tau: float) -> None:
    result = _two_rounds(make())
    np.testing.assert_allclose(result["w"], _expected(rule, tau, "w"), rtol=1e-12)
    np.testing.assert_allclose(result["b"], _expected(rule, tau, "b"), rtol=1e-5)
    assert result["b"].dtype == np.float32
    # The counter takes the mean: (103 + 3 · 104) / 4 = 103.75 -> 104, then 107.
    assert result["steps"].dtype == np.int64
    np.testing.assert_array_equal(result["steps"], [107])


@pytest.mark.parametrize("make", [case[0] for case in CASES], ids=IDS)
def test_error_replies_change_nothing(make: Callable[[], FedOpt]) -> None:
    assert _two_rounds(make()) == _two_rounds(make(), errors=True)


def test_moments_are_kept_per_float_array() -> None:
    adam = FedAdam()
    _two_rounds(adam)
    assert list(adam.m_t) == list(adam.v_t) == ["w", "b"]
    assert adam.v_t["b"].dtype == np.float32
    adagrad = FedAdagrad()
    _two_rounds(adagrad)
    assert adagrad.m_t == {}  # beta_1 = 0: the first moment is Δ itself, nothing to keep
    assert list(adagrad.v_t) == ["w", "b"]


def test_a_model_with_another_layout_is_refused_and_state_kept() -> None:
    strategy = FedYogi()
    arrays = _round(strategy, 1, ArrayRecord(X0), ROUNDS[0])
    assert arrays is not None
    kept = {key: value.copy() for key, value in strategy.v_t.items()}
    narrowed = ArrayRecord({"w": arrays["w"], "b": arrays["b"].astype(np.float64)})
    update = {"w": np.zeros(3), "b": np.zeros((1, 1))}
    with pytest.raises(AggregationError, match="layout changed"):
        _round(strategy, 2, narrowed, [(update, 1)])
    assert strategy.v_t.keys() == kept.keys()
    for key, value in kept.items():
        np.testing.assert_array_equal(strategy.v_t[key], value)


def test_an_aggregate_with_another_layout_is_refused() -> None:
    strategy = FedAdam()
    update: dict[str, np.ndarray] = {
        "w": np.zeros(4),
        "b": np.zeros((1, 1), np.float32),
        "steps": np.array([1]),
    }
    with pytest.raises(AggregationError, match=r"'w' has shape \[4\], the model's has \[3\]"):
        _round(strategy, 1, ArrayRecord(X0), [(update, 1)])
    assert strategy.v_t == {}
    with pytest.raises(AggregationError, match=r"do not match the model's \['b', 'steps', 'w'\]"):
        _round(strategy, 1, ArrayRecord(X0), [({**update, "extra": np.zeros(1)}, 1)])
    assert issubclass(AggregationError, ValueError)


def test_flower_defaults() -> None:
    def settings(strategy: FedOpt) -> tuple[float, ...]:
        return (strategy.eta, strategy.eta_l, strategy.beta_1, strategy.beta_2, strategy.tau)

    assert settings(FedAdam()) == (0.1, 0.1, 0.9, 0.99, 1e-3)
    assert settings(FedYogi()) == (1e-2, 0.0316, 0.9, 0.99, 1e-3)
    assert settings(FedAdagrad()) == (0.1, 0.1, 0.0, 0.0, 1e-3)


def test_arguments_are_keyword_only_and_fedopt_is_abstract() -> None:
    with pytest.raises(TypeError):
        FedAdam(0.5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="abstract"):
        FedOpt()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="beta_1"):
        FedAdagrad(beta_1=0.5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"eta": 0.0}, ValueError),
        ({"eta_l": -1.0}, ValueError),
        ({"beta_1": 1.0}, ValueError),
        ({"beta_2": -0.1}, ValueError),
        ({"tau": 0.0}, ValueError),
        ({"tau": "1e-3"}, TypeError),
        ({"min_train_nodes": 1.5}, TypeError),
    ],
)
@pytest.mark.parametrize("cls", [FedAdam, FedYogi])
def test_bad_arguments(
    cls: type[FedOpt], arguments: dict[str, object], error: type[Exception]
) -> None:
    name = next(iter(arguments))
    with pytest.raises(error, match=name):
        cls(**arguments)  # type: ignore[arg-type]


async def test_fedadam_through_a_simulation() -> None:
    """The real round driver: every node returns its model plus one, so Δ = 1 each round."""
    client = fc.ClientApp()

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        arrays = fc.ArrayRecord({"w": msg.content.array_records["arrays"]["w"] + 1.0})
        content = fc.RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})})
        return fc.Message(content, reply_to=msg)

    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> Result:
        strategy = FedAdam(fraction_evaluate=0.0)
        w0 = fc.ArrayRecord({"w": np.zeros(2, np.float32)})
        return await strategy.start(grid=grid, initial_arrays=w0, num_rounds=2)

    app = fc.App(server=server, client=client)
    result: Result = (await fc.simulate(app, nodes=2, seed=0, backend="inline")).value
    x, m, v = 0.0, 0.0, 0.0
    for r in (1, 2):
        m, v = 0.9 * m + 0.1, 0.99 * v + 0.01
        x += 0.1 * math.sqrt(1 - 0.99 ** (r + 1)) / (1 - 0.9 ** (r + 1)) * m / (math.sqrt(v) + 1e-3)
    assert result.arrays["w"].dtype == np.float32
    np.testing.assert_allclose(result.arrays["w"], [x, x], rtol=1e-6)
