"""The server optimizer steps and the q-FFL step, against numbers worked out by hand
or straight from the papers' formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.strategy.optimizers import (
    adagrad_step,
    adam_step,
    momentum_step,
    qffl_step,
    step_floats,
    yogi_step,
)


def test_momentum_two_steps_by_hand() -> None:
    # g1 = (1, 2) - (0.5, 2.5) = (0.5, -0.5); v1 = g1; x1 = x0 - 0.5 v1 = (0.75, 2.25)
    x1, v1 = momentum_step(
        np.array([1.0, 2.0]),
        np.array([0.5, 2.5]),
        np.zeros(2),
        learning_rate=0.5,
        momentum=0.9,
    )
    np.testing.assert_allclose(v1, [0.5, -0.5])
    np.testing.assert_allclose(x1, [0.75, 2.25])
    # g2 = (0.75, 2.25) - (0.25, 2.0) = (0.5, 0.25); v2 = 0.9 v1 + g2 = (0.95, -0.2)
    x2, v2 = momentum_step(x1, np.array([0.25, 2.0]), v1, learning_rate=0.5, momentum=0.9)
    np.testing.assert_allclose(v2, [0.95, -0.2])
    np.testing.assert_allclose(x2, [0.275, 2.35])


def test_adam_one_step_by_hand() -> None:
    # Δ = 1: m = 0.1, v = 0.01; η_t = 0.1 · √(1 − 0.99²) / (1 − 0.9²) at t = 2
    new, m, v = adam_step(
        np.array([0.0]),
        np.array([1.0]),
        np.zeros(1),
        np.zeros(1),
        eta=0.1,
        beta_1=0.9,
        beta_2=0.99,
        tau=1e-3,
        t=2,
    )
    eta_t = 0.1 * math.sqrt(1 - 0.9801) / (1 - 0.81)
    assert m[0] == pytest.approx(0.1)
    assert v[0] == pytest.approx(0.01)
    assert new[0] == pytest.approx(eta_t * 0.1 / (0.1 + 1e-3))


def test_adam_two_steps_follow_kingma_and_ba() -> None:
    x = np.array([0.5, -1.0, 2.0])
    means = [np.array([0.7, -1.5, 2.0]), np.array([0.2, -1.0, 2.5])]
    m = v = np.zeros(3)
    ex, em, ev = x.copy(), np.zeros(3), np.zeros(3)
    for t, mean in enumerate(means, start=3):
        x, m, v = adam_step(x, mean, m, v, eta=0.3, beta_1=0.8, beta_2=0.95, tau=0.01, t=t)
        g = mean - ex
        em = 0.8 * em + 0.2 * g
        ev = 0.95 * ev + 0.05 * g * g
        ex = ex + 0.3 * np.sqrt(1 - 0.95**t) / (1 - 0.8**t) * em / (np.sqrt(ev) + 0.01)
    np.testing.assert_allclose(x, ex)
    np.testing.assert_allclose(m, em)
    np.testing.assert_allclose(v, ev)


def test_yogi_second_moment_moves_additively() -> None:
    # v = 1 > Δ² = 0.25: v shrinks by (1 − β₂) Δ² = 0.5 · 0.25; v = 0 < Δ² = 4: grows by 0.5 · 4
    new, m, v = yogi_step(
        np.array([0.0, 0.0]),
        np.array([0.5, 2.0]),
        np.array([0.0, 0.0]),
        np.array([1.0, 0.0]),
        eta=0.1,
        beta_1=0.5,
        beta_2=0.5,
        tau=0.5,
    )
    np.testing.assert_allclose(v, [0.875, 2.0])
    np.testing.assert_allclose(m, [0.25, 1.0])
    np.testing.assert_allclose(
        new, [0.1 * 0.25 / (math.sqrt(0.875) + 0.5), 0.1 * 1.0 / (math.sqrt(2.0) + 0.5)]
    )


def test_yogi_two_steps_follow_the_paper() -> None:
    x = np.array([1.0, 0.0])
    m = v = np.zeros(2)
    ex, em, ev = x.copy(), np.zeros(2), np.zeros(2)
    for mean in (np.array([1.5, -0.2]), np.array([1.6, 0.4])):
        x, m, v = yogi_step(x, mean, m, v, eta=0.05, beta_1=0.9, beta_2=0.99, tau=1e-3)
        g = mean - ex
        em = 0.9 * em + 0.1 * g
        ev = ev - 0.01 * g * g * np.sign(ev - g * g)
        ex = ex + 0.05 * em / (np.sqrt(ev) + 1e-3)
    np.testing.assert_allclose(x, ex)
    np.testing.assert_allclose(v, ev)


def test_adagrad_sums_squares() -> None:
    # Δ1 = 3: v = 9, x1 = 0.1 · 3 / (3 + 1) = 0.075; Δ2 = 4.075 − 0.075 = 4: v = 25
    x1, m1, v1 = adagrad_step(
        np.array([0.0]), np.array([3.0]), np.zeros(1), np.zeros(1), eta=0.1, beta_1=0.0, tau=1.0
    )
    assert v1[0] == 9.0
    assert m1[0] == 3.0
    assert x1[0] == pytest.approx(0.075)
    x2, _, v2 = adagrad_step(x1, np.array([4.075]), m1, v1, eta=0.1, beta_1=0.0, tau=1.0)
    assert v2[0] == pytest.approx(25.0)
    assert x2[0] == pytest.approx(0.075 + 0.1 * 4 / 6)


def _qffl_by_formula(
    w: np.ndarray, locals_: list[np.ndarray], losses: list[float], q: float, lr: float
) -> np.ndarray:
    big_l = 1 / lr
    deltas, hs = [], []
    for wk, loss in zip(locals_, losses, strict=True):
        f = loss + 1e-10
        dw = big_l * (w - wk)
        deltas.append(f**q * dw)
        hs.append(q * f ** (q - 1) * np.sum(dw**2) + big_l * f**q)
    new: np.ndarray = w - np.sum(deltas, axis=0) / np.sum(hs)
    return new


def test_qffl_matches_the_paper_across_arrays() -> None:
    current = {"a": np.array([1.0, 2.0]), "b": np.array([[0.5]])}
    local = [
        {"a": np.array([0.5, 2.5]), "b": np.array([[0.0]])},
        {"a": np.array([2.0, 1.0]), "b": np.array([[1.5]])},
    ]
    losses = [0.4, 2.5]
    new = qffl_step(current, zip(local, losses, strict=True), q=2.0, learning_rate=0.1)
    # The norm in h_k runs over both arrays: flatten them into one vector.
    flat = _qffl_by_formula(
        np.array([1.0, 2.0, 0.5]),
        [np.array([0.5, 2.5, 0.0]), np.array([2.0, 1.0, 1.5])],
        losses,
        2.0,
        0.1,
    )
    np.testing.assert_allclose(new["a"], flat[:2])
    np.testing.assert_allclose(new["b"], [[flat[2]]])
    assert list(new) == ["a", "b"]


def test_qffl_with_q_zero_is_the_unweighted_mean() -> None:
    current = {"w": np.array([0.0, 0.0])}
    local = [{"w": np.array([1.0, 3.0])}, {"w": np.array([2.0, 6.0])}]
    new = qffl_step(current, zip(local, [5.0, 0.1], strict=True), q=0.0, learning_rate=0.01)
    np.testing.assert_allclose(new["w"], [1.5, 4.5])


def test_qffl_keeps_zero_dimensional_arrays_arrays() -> None:
    new = qffl_step({"t": np.array(1.0)}, [({"t": np.array(3.0)}, 1.0)], q=0.0, learning_rate=1.0)
    assert type(new["t"]) is np.ndarray
    assert new["t"] == 3.0


def test_qffl_zero_loss_is_offset_and_dtype_kept() -> None:
    current = {"w": np.array([1.0], dtype=np.float32)}
    local = [({"w": np.array([0.0], dtype=np.float32)}, 0.0)]
    new = qffl_step(current, local, q=1.0, learning_rate=1.0)
    assert new["w"].dtype == np.float32
    expected = _qffl_by_formula(np.array([1.0]), [np.array([0.0])], [0.0], 1.0, 1.0)
    np.testing.assert_allclose(new["w"], expected.astype(np.float32))


@pytest.mark.parametrize(
    ("local", "message"),
    [
        ([({"w": np.zeros(1)}, -0.5)], "non-negative losses"),
        ([({"w": np.zeros(1)}, math.inf)], "finite"),
        ([], "at least one local model"),
        ([({"w": np.zeros(1)}, 0.0)], "undefined"),
    ],
)
def test_qffl_refuses(local: list[tuple[dict[str, np.ndarray], float]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        # q = 50 at a zero loss: (1e-10)^50 underflows, every h_k is 0.
        qffl_step({"w": np.ones(1)}, local, q=50.0, learning_rate=1.0)


def _halfway(key: str, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
    new: np.ndarray = current + 0.5 * (mean - current)
    return new


def test_step_floats_steps_floats_only_and_keeps_dtypes() -> None:
    seen: dict[str, np.dtype[np.generic]] = {}

    def step(key: str, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        seen[key] = current.dtype
        return _halfway(key, current, mean)

    current: dict[str, np.ndarray] = {
        "w": np.array([0.0, 2.0], dtype=np.float32),
        "h": np.array([1.0], dtype=np.float16),
        "t": np.array(1.0),
        "steps": np.array(4, dtype=np.int64),
        "mask": np.array([True, False]),
    }
    mean: dict[str, np.ndarray] = {
        "mask": np.array([False, False]),
        "w": np.array([1.0, 4.0], dtype=np.float32),
        "h": np.array([3.0], dtype=np.float16),
        "t": np.array(2.0),
        "steps": np.array(9, dtype=np.int64),
    }
    new = step_floats(current, mean, {}, step)
    assert list(new) == ["w", "h", "t", "steps", "mask"]
    assert all(type(array) is np.ndarray for array in new.values())
    assert {key: array.dtype for key, array in new.items()} == {
        key: array.dtype for key, array in current.items()
    }
    np.testing.assert_array_equal(new["w"], [0.5, 3.0])
    np.testing.assert_array_equal(new["h"], [2.0])
    assert new["t"] == 1.5
    assert new["steps"] == 9
    np.testing.assert_array_equal(new["mask"], [False, False])
    assert seen == {
        "w": np.float32,
        "h": np.float32,
        "t": np.float64,
    }  # float16 math runs in float32


@pytest.mark.parametrize(
    ("mean", "message"),
    [
        ({"w": np.zeros(2), "x": np.zeros(1)}, "do not match"),
        ({"w": np.zeros(3)}, "shape"),
    ],
)
def test_step_floats_refuses_another_layout(mean: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        step_floats({"w": np.zeros(2)}, mean, {}, _halfway)


@pytest.mark.parametrize(
    "state",
    [
        {"v": np.zeros(3)},
        {"w": np.zeros(3)},
        {"w": np.zeros(2, dtype=np.float32)},
    ],
)
def test_step_floats_refuses_a_model_the_state_does_not_fit(state: dict[str, np.ndarray]) -> None:
    def never(key: str, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        raise AssertionError("stepped despite a mismatched state")

    with pytest.raises(ValueError, match="layout changed between rounds"):
        step_floats({"w": np.zeros(2)}, {"w": np.ones(2)}, {"m": state}, never)
