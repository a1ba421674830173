"""Server-side optimizer steps and the q-FFL step, as pure numpy.

The strategies that treat the round's mean as a pseudo-gradient (FedAvgM, FedAdam,
FedYogi, FedAdagrad) and q-FedAvg keep their state and read replies; the math is
here, one array at a time, so that each rule can be checked against its paper
without a message in sight.

Dtypes. Only floating-point arrays are optimized. Integer and boolean arrays
(counters such as a batch-norm ``num_batches_tracked``, masks) take the round's
aggregate unchanged: a step of ``η · m / (√v + τ)`` means nothing for a counter.
Flower 1.42 steps every array: an integer counter comes back as float64 (FedAdam
moves it by about ``η`` a round, whatever the nodes counted), a boolean array makes
the subtraction fail, and q-FedAvg fails on integer arrays. We do not follow it
there. Complex arrays are left alone too (Adam's ``√v`` has no meaning for them).
The math runs in the array's own float type, promoted to at least float32 — a
float16 second moment underflows to zero once ``Δ²`` drops below 6e-8, and the
step becomes ``η · m / τ`` — and the result is cast back, so a float32 model stays
float32 and its optimizer state costs one float32 copy per moment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from fedcore.domain.array import NDArray
from fedcore.domain.records import ArrayRecord, RecordDict
from fedcore.errors import AggregationError

QFFL_LOSS_OFFSET = 1e-10
"""Added to each loss before raising it to ``q`` and ``q − 1`` (as Flower does), so a
node reporting a loss of exactly zero does not make ``0^(q−1)`` infinite."""


def optimized(array: NDArray) -> bool:
    """Whether an optimizer step applies to ``array``: real floating point only."""
    return array.dtype.kind == "f"


def working_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype an optimized array's math and state use: its own, at least float32."""
    return np.promote_types(dtype, np.float32)


def check_layout(expected: Mapping[str, NDArray], arrays: Mapping[str, NDArray]) -> None:
    """Raise :class:`~fedcore.errors.AggregationError` (a ``ValueError``) unless ``arrays``
    has ``expected``'s keys and shapes.

    Dtypes may differ (a node that returns float64 for a float32 model is averaged
    all the same); the step casts to the expected array's dtype.
    """
    if set(arrays) != set(expected):
        raise AggregationError(
            f"arrays {sorted(arrays)} do not match the model's {sorted(expected)}"
        )
    for key, reference in expected.items():
        if arrays[key].shape != reference.shape:
            raise AggregationError(
                f"array {key!r} has shape {list(arrays[key].shape)}, "
                f"the model's has {list(reference.shape)}"
            )


def _check_state(name: str, state: Mapping[str, NDArray], model: Mapping[str, NDArray]) -> None:
    if not state:
        return
    floats = {key: array for key, array in model.items() if optimized(array)}
    if set(state) != set(floats):
        raise AggregationError(
            f"{name} holds arrays {sorted(state)} but the model's float arrays are "
            f"{sorted(floats)}: the model's layout changed between rounds"
        )
    for key, array in floats.items():
        held = state[key]
        if held.shape != array.shape or held.dtype != working_dtype(array.dtype):
            raise AggregationError(
                f"{name}[{key!r}] is {held.dtype}{list(held.shape)} but the model's array is "
                f"{array.dtype}{list(array.shape)}: the model's layout changed between rounds"
            )


def step_floats(
    current: Mapping[str, NDArray],
    aggregated: Mapping[str, NDArray],
    states: Mapping[str, Mapping[str, NDArray]],
    step: Callable[[str, NDArray, NDArray], NDArray],
) -> dict[str, NDArray]:
    """The new model: ``step(key, current, mean)`` for each float array, the mean for the rest.

    ``states`` names the optimizer's per-key state dicts (empty before the first
    step); every check runs before ``step`` is first called, so a refused
    aggregate leaves the state as it was. ``step`` gets both arrays in
    :func:`working_dtype` and its result is cast back to the model's dtype. Keys
    come out in the model's order.
    """
    check_layout(current, aggregated)
    for name, state in states.items():
        _check_state(name, state, current)
    updated: dict[str, NDArray] = {}
    for key, array in current.items():
        mean = aggregated[key]
        if not optimized(array):
            updated[key] = mean
            continue
        work = working_dtype(array.dtype)
        new = step(key, array.astype(work, copy=False), mean.astype(work, copy=False))
        # np.asarray: arithmetic on 0-d arrays yields numpy scalars.
        updated[key] = np.asarray(new, dtype=array.dtype)
    return updated


def states_record(states: Mapping[str, Mapping[str, NDArray]]) -> RecordDict:
    """An optimizer's per-key state dicts, by name, as an ArrayRecord each: what
    :meth:`~fedcore.strategy.base.Strategy.state` returns for them. Empty ones are
    left out (none has been kept before the first step)."""
    return RecordDict({name: ArrayRecord(dict(state)) for name, state in states.items() if state})


def load_states(owner: str, record: RecordDict, states: Mapping[str, dict[str, NDArray]]) -> None:
    """Refill ``states`` (the optimizer's own dicts, by name) from what
    :func:`states_record` made of them; each array is copied, so the next step may
    update it, and a name ``owner`` does not keep is refused."""
    unknown = [name for name in record if name not in states]
    if unknown:
        raise ValueError(f"{owner} keeps no state named {', '.join(map(repr, unknown))}")
    for name, state in states.items():
        held = record.get(name, ArrayRecord())
        if not isinstance(held, ArrayRecord):
            raise ValueError(f"{owner}'s {name} must be an ArrayRecord, got {type(held).__name__}")
        state.clear()
        state.update((key, np.array(array)) for key, array in held.items())


def momentum_step(
    current: NDArray, mean: NDArray, velocity: NDArray, *, learning_rate: float, momentum: float
) -> tuple[NDArray, NDArray]:
    """Server SGD with heavy-ball momentum on the pseudo-gradient (FedAvgM, Hsu et al. 2019).

    ``g = current − mean``; ``velocity ← momentum · velocity + g``;
    ``new = current − learning_rate · velocity`` (PyTorch's SGD convention, no
    dampening, no Nesterov). Starting from a zero velocity, the first step's velocity
    is ``g``. Returns ``(new, velocity)``.
    """
    velocity = momentum * velocity + (current - mean)
    return current - learning_rate * velocity, velocity


def _first_moment(m: NDArray, delta: NDArray, beta_1: float) -> NDArray:
    return beta_1 * m + (1.0 - beta_1) * delta


def _adaptive(current: NDArray, m: NDArray, v: NDArray, eta: float, tau: float) -> NDArray:
    return current + eta * m / (np.sqrt(v) + tau)


def adam_step(
    current: NDArray,
    mean: NDArray,
    m: NDArray,
    v: NDArray,
    *,
    eta: float,
    beta_1: float,
    beta_2: float,
    tau: float,
    t: float,
) -> tuple[NDArray, NDArray, NDArray]:
    """FedAdam (Reddi et al. 2021, Algorithm 2) with Adam's bias-corrected step size.

    ``Δ = mean − current``; ``m ← β₁m + (1−β₁)Δ``; ``v ← β₂v + (1−β₂)Δ²``;
    ``new = current + η_t · m / (√v + τ)`` with
    ``η_t = η · √(1 − β₂ᵗ) / (1 − β₁ᵗ)`` (Kingma & Ba's ``α_t``; the paper's
    Algorithm 2 has no correction, Flower adds it). Returns ``(new, m, v)``.
    """
    delta = mean - current
    m = _first_moment(m, delta, beta_1)
    v = beta_2 * v + (1.0 - beta_2) * np.square(delta)
    eta_t = eta * math.sqrt(1.0 - beta_2**t) / (1.0 - beta_1**t)
    return _adaptive(current, m, v, eta_t, tau), m, v


def yogi_step(
    current: NDArray,
    mean: NDArray,
    m: NDArray,
    v: NDArray,
    *,
    eta: float,
    beta_1: float,
    beta_2: float,
    tau: float,
) -> tuple[NDArray, NDArray, NDArray]:
    """FedYogi (Reddi et al. 2021, Algorithm 2): Adam whose ``v`` moves additively.

    ``Δ = mean − current``; ``m ← β₁m + (1−β₁)Δ``;
    ``v ← v − (1−β₂) · Δ² · sign(v − Δ²)``; ``new = current + η · m / (√v + τ)``.
    No bias correction. Returns ``(new, m, v)``.
    """
    delta = mean - current
    m = _first_moment(m, delta, beta_1)
    squared = np.square(delta)
    v = v - (1.0 - beta_2) * squared * np.sign(v - squared)
    return _adaptive(current, m, v, eta, tau), m, v


def adagrad_step(
    current: NDArray,
    mean: NDArray,
    m: NDArray,
    v: NDArray,
    *,
    eta: float,
    beta_1: float,
    tau: float,
) -> tuple[NDArray, NDArray, NDArray]:
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): ``v`` sums the squared pseudo-gradients.

    ``Δ = mean − current``; ``m ← β₁m + (1−β₁)Δ``; ``v ← v + Δ²``;
    ``new = current + η · m / (√v + τ)``. Returns ``(new, m, v)``.
    """
    delta = mean - current
    m = _first_moment(m, delta, beta_1)
    v = v + np.square(delta)
    return _adaptive(current, m, v, eta, tau), m, v


def qffl_step(
    current: Mapping[str, NDArray],
    local_models: Iterable[tuple[Mapping[str, NDArray], float]],
    *,
    q: float,
    learning_rate: float,
) -> dict[str, NDArray]:
    """One q-FedAvg server step (Li et al. 2020, "Fair Resource Allocation in FL", Alg. 2).

    With ``L = 1 / learning_rate`` (the clients' step size bounds the Lipschitz
    constant) and, for each node ``k`` with local model ``w_k`` and training loss
    ``F_k``:

    - ``Δw_k = L · (current − w_k)``,
    - ``Δ_k = F_k^q · Δw_k``,
    - ``h_k = q · F_k^(q−1) · ‖Δw_k‖² + L · F_k^q``, the norm over every array;

    the new model is ``current − Σ_k Δ_k / Σ_k h_k``. ``F_k`` is offset by
    :data:`QFFL_LOSS_OFFSET`. With ``q = 0`` this is the unweighted mean of the
    ``w_k``. Each ``w_k`` must have ``current``'s keys and shapes; sums run in
    float64, one local model at a time, and the result has ``current``'s dtypes.
    Raises ``ValueError`` for a negative or infinite loss, when there is no local
    model, and when every ``h_k`` underflows to 0 (zero losses with a large ``q``).
    """
    sums = {key: np.zeros(array.shape, dtype=np.float64) for key, array in current.items()}
    h_total = 0.0
    count = 0
    for local, loss in local_models:
        delta, h = qffl_terms(current, local, loss, q=q, learning_rate=learning_rate)
        for key, array in delta.items():
            sums[key] += array
        h_total += h
        count += 1
    if count == 0:
        raise ValueError("q-FFL needs at least one local model")
    return qffl_apply(current, sums, h_total)


def qffl_terms(
    current: Mapping[str, NDArray],
    local: Mapping[str, NDArray],
    loss: float,
    *,
    q: float,
    learning_rate: float,
) -> tuple[dict[str, NDArray], float]:
    """Node ``k``'s share of :func:`qffl_step`: ``(Δ_k, h_k)``, ``Δ_k`` in float64."""
    if not (loss >= 0 and math.isfinite(loss)):
        raise ValueError(f"q-FFL needs finite non-negative losses, got {loss!r}")
    lipschitz = 1.0 / learning_rate
    offset = loss + QFFL_LOSS_OFFSET
    scale = offset**q
    squared_norm = 0.0
    delta: dict[str, NDArray] = {}
    for key, array in current.items():
        step = lipschitz * (array.astype(np.float64) - local[key])
        squared_norm += float(np.vdot(step, step))
        delta[key] = scale * step
    return delta, q * offset ** (q - 1.0) * squared_norm + lipschitz * scale


def qffl_apply(
    current: Mapping[str, NDArray], delta_sum: Mapping[str, NDArray], h_total: float
) -> dict[str, NDArray]:
    """The end of :func:`qffl_step`: ``current − Σ_k Δ_k / Σ_k h_k``, in ``current``'s
    dtypes; ``ValueError`` when the ``h_k`` sum to nothing."""
    if not h_total > 0:
        raise ValueError(f"q-FFL step undefined: the h_k sum to {h_total!r}")
    return {
        key: np.asarray(array - delta_sum[key] / h_total, dtype=array.dtype)
        for key, array in current.items()
    }
