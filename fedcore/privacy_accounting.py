"""Privacy accounting: how much differential privacy a run has spent, release by release.

Flower 1.42's ``flwr.serverapp`` accounting API on fedcore's own types. A
:class:`PrivacyConfig` fixes the population the clients come from, how each round
samples them (:class:`SamplingMethod`), which populations count as neighbours
(:class:`NeighboringRelation`), the delta to report at and an optional epsilon
budget. Each private release — a round's noised aggregate — is a
:class:`GaussianPrivacyEvent` (its noise multiplier and how many clients it sampled);
an accountant composes them and answers with the cumulative (epsilon, delta) as
:class:`PrivacySpent`, or says beforehand whether one more round would pass the budget.

:class:`RdpAccountant` does the arithmetic in Rényi differential privacy with Google's
``dp-accounting`` (``pip install 'fedcore[dp]'``), imported when an accountant is
made: naming these types costs an app nothing. What an accountant keeps is its ledger
of composed events; :meth:`RdpAccountant.state_dict` is that ledger as JSON (the keys
Flower writes), and dp-accounting's own state is rebuilt from it whenever needed — for
a prospective :meth:`~RdpAccountant.would_exceed` and for a restore. The clipping and
noise that make the releases private are :mod:`fedcore.privacy`'s.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from enum import Enum, StrEnum
from types import ModuleType
from typing import Any, NamedTuple, Protocol

from fedcore.errors import UsageError

DP_EXTRA = "pip install 'fedcore[dp]'"
"""What installs the accountant's dp-accounting."""

ACCOUNTING_METHOD = "rdp"
STATE_SCHEMA_VERSION = 1


class NeighboringRelation(StrEnum):
    """Which two client populations count as neighbours: one client more or fewer, or
    one client swapped for another."""

    ADD_OR_REMOVE_ONE = "add-or-remove-one"
    REPLACE_ONE = "replace-one"


class SamplingMethod(StrEnum):
    """How a release chooses its clients: each independently with the same probability
    (Poisson), a fixed number without replacement, or every release counted as if it
    saw the whole population (no amplification by sampling)."""

    POISSON = "poisson"
    WITHOUT_REPLACEMENT = "without-replacement"
    NO_AMPLIFICATION = "no-amplification"


_MODELS = {
    SamplingMethod.POISSON: NeighboringRelation.ADD_OR_REMOVE_ONE,
    SamplingMethod.WITHOUT_REPLACEMENT: NeighboringRelation.REPLACE_ONE,
    SamplingMethod.NO_AMPLIFICATION: NeighboringRelation.ADD_OR_REMOVE_ONE,
}
"""The neighbouring relation each sampling method is accounted under (the pairs for
which the subsampled-Gaussian RDP bounds hold)."""


@dataclass(frozen=True)
class PrivacyConfig:
    """The accounting model of a run: checked when made.

    ``sampling_method`` and ``neighboring_relation`` also take their values as text
    (``"poisson"``), as a run config holds them.
    """

    target_delta: float
    population_size: int
    neighboring_relation: NeighboringRelation
    sampling_method: SamplingMethod
    max_epsilon: float | None = None

    def __post_init__(self) -> None:
        _check_probability("target_delta", self.target_delta)
        _check_count("population_size", self.population_size)
        if self.max_epsilon is not None:
            _check_positive("max_epsilon", self.max_epsilon)
        relation = _member(NeighboringRelation, "neighboring_relation", self.neighboring_relation)
        method = _member(SamplingMethod, "sampling_method", self.sampling_method)
        object.__setattr__(self, "neighboring_relation", relation)
        object.__setattr__(self, "sampling_method", method)
        if _MODELS[method] is not relation:
            raise UsageError(
                f"privacy accounting has no model for sampling_method {method.value!r} with "
                f"neighboring_relation {relation.value!r}; {method.value!r} is accounted "
                f"under {_MODELS[method].value!r}"
            )


@dataclass(frozen=True)
class GaussianPrivacyEvent:
    """One release (or several alike) of a sum with Gaussian noise over sampled clients.

    Under Poisson sampling ``sample_size / population_size`` is each client's
    probability of being sampled; without replacement ``sample_size`` is the exact
    number sampled; with no amplification they are kept for the record only.
    """

    noise_multiplier: float
    sample_size: int
    population_size: int

    def __post_init__(self) -> None:
        _check_positive("noise_multiplier", self.noise_multiplier)
        _check_count("sample_size", self.sample_size)
        _check_count("population_size", self.population_size)
        if self.sample_size > self.population_size:
            raise UsageError(
                f"sample_size {self.sample_size} is larger than population_size "
                f"{self.population_size}"
            )


@dataclass(frozen=True)
class PrivacySpent:
    """The privacy a run has spent so far: (``epsilon``, ``delta``)-DP over
    ``num_releases`` releases, by ``accounting_method`` (at RDP order ``optimal_order``)."""

    epsilon: float
    delta: float
    num_releases: int
    accounting_method: str
    optimal_order: float | None = None


class PrivacyAccountant(Protocol):
    """What a privacy accountant offers a ServerApp; :class:`RdpAccountant` is one."""

    @property
    def config(self) -> PrivacyConfig:
        """The accounting model."""
        ...

    @property
    def num_releases(self) -> int:
        """How many releases have been composed."""
        ...

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        """Add ``count`` releases like ``event`` to what has been spent."""
        ...

    def get_epsilon(self, delta: float) -> float:
        """The epsilon spent so far, at ``delta``."""
        ...

    def get_delta(self, epsilon: float) -> float:
        """The delta spent so far, at ``epsilon``."""
        ...

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        """What has been spent, at ``delta`` (the config's ``target_delta`` by default)."""
        ...

    def would_exceed(
        self, event: GaussianPrivacyEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        """Whether ``count`` more releases like ``event`` would spend more than
        ``max_epsilon`` (the config's by default), without spending anything."""
        ...

    def state_dict(self) -> dict[str, object]:
        """What the accountant has composed, as JSON-ready values."""
        ...

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Go on from a :meth:`state_dict`."""
        ...


class RdpAccountant:
    """A :class:`PrivacyAccountant` in Rényi differential privacy, on dp-accounting's.

    ``orders`` are the RDP orders to optimise epsilon over (dp-accounting's defaults
    when ``None``). Making one needs dp-accounting installed (``ImportError`` naming
    the extra otherwise).
    """

    def __init__(self, config: PrivacyConfig, orders: tuple[float, ...] | None = None) -> None:
        self._dp = _import_dp_accounting()
        self._config = config
        self._ledger: list[tuple[GaussianPrivacyEvent, int]] = []
        backend = self._backend_for([], None if orders is None else _checked_orders(orders))
        self._orders = tuple(float(order) for order in backend.orders)
        self._backend = backend

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        return sum(count for _, count in self._ledger)

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        self._check_event(event)
        _check_count("count", count)
        self._backend.compose(self._dp_event(event), count)
        self._ledger.append((event, count))

    def get_epsilon(self, delta: float) -> float:
        _check_probability("delta", delta)
        return float(self._backend.get_epsilon(delta))

    def get_delta(self, epsilon: float) -> float:
        if _finite("epsilon", epsilon) < 0:
            raise UsageError(f"epsilon must be at least 0; got {epsilon!r}")
        return float(self._backend.get_delta(epsilon))

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        delta = self._config.target_delta if delta is None else delta
        _check_probability("delta", delta)
        epsilon, order = self._backend.get_epsilon_and_optimal_order(delta)
        return PrivacySpent(
            epsilon=float(epsilon),
            delta=delta,
            num_releases=self.num_releases,
            accounting_method=ACCOUNTING_METHOD,
            optimal_order=float(order),
        )

    def would_exceed(
        self, event: GaussianPrivacyEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        self._check_event(event)
        _check_count("count", count)
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise UsageError(
                "would_exceed needs an epsilon budget: pass max_epsilon, or set it in PrivacyConfig"
            )
        _check_positive("max_epsilon", limit)
        projected = self._backend_for([*self._ledger, (event, count)], self._orders)
        return bool(projected.get_epsilon(self._config.target_delta) > limit)

    def state_dict(self) -> dict[str, object]:
        config = self._config
        return {
            "schema_version": STATE_SCHEMA_VERSION,
            "backend": ACCOUNTING_METHOD,
            "config": {
                "target_delta": config.target_delta,
                "population_size": config.population_size,
                "neighboring_relation": config.neighboring_relation.value,
                "sampling_method": config.sampling_method.value,
                "max_epsilon": config.max_epsilon,
            },
            "orders": list(self._orders),
            "compositions": [
                {
                    "event": {
                        "noise_multiplier": event.noise_multiplier,
                        "sample_size": event.sample_size,
                        "population_size": event.population_size,
                    },
                    "count": count,
                }
                for event, count in self._ledger
            ],
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Go on from ``state``, which must have been written under this accountant's
        config; nothing changes when it is refused (``UsageError``)."""
        if state.get("schema_version") != STATE_SCHEMA_VERSION:
            raise UsageError(
                f"accountant state of schema version {state.get('schema_version')!r}; "
                f"this accountant reads version {STATE_SCHEMA_VERSION}"
            )
        if state.get("backend") != ACCOUNTING_METHOD:
            raise UsageError(
                f"accountant state written by a {state.get('backend')!r} accountant, "
                f"not an {ACCOUNTING_METHOD!r} one"
            )
        try:
            config = PrivacyConfig(**_table(state["config"]))
            orders = _checked_orders(tuple(_number(order) for order in _list(state["orders"])))
            ledger = [_composition(item) for item in _list(state["compositions"])]
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"accountant state that cannot be read: {exc}") from None
        if config != self._config:
            raise UsageError(
                f"accountant state written under {config}, not this accountant's {self._config}"
            )
        for event, _ in ledger:
            self._check_event(event)
        self._backend = self._backend_for(ledger, orders)
        self._orders = orders
        self._ledger = ledger

    def _backend_for(
        self, ledger: list[tuple[GaussianPrivacyEvent, int]], orders: tuple[float, ...] | None
    ) -> Any:
        """A dp-accounting RDP accountant that has composed ``ledger``."""
        relation = self._dp.privacy_accountant.NeighboringRelation[
            self._config.neighboring_relation.name
        ]
        backend = self._dp.rdp.RdpAccountant(orders=orders, neighboring_relation=relation)
        for event, count in ledger:
            backend.compose(self._dp_event(event), count)
        return backend

    def _dp_event(self, event: GaussianPrivacyEvent) -> Any:
        """``event`` as a dp-accounting event under the config's sampling method."""
        dp_event = self._dp.dp_event
        gaussian = dp_event.GaussianDpEvent(event.noise_multiplier)
        method = self._config.sampling_method
        if method is SamplingMethod.POISSON:
            rate = event.sample_size / event.population_size
            return dp_event.PoissonSampledDpEvent(rate, gaussian)
        if method is SamplingMethod.WITHOUT_REPLACEMENT:
            return dp_event.SampledWithoutReplacementDpEvent(
                event.population_size, event.sample_size, gaussian
            )
        return gaussian

    def _check_event(self, event: GaussianPrivacyEvent) -> None:
        if event.population_size != self._config.population_size:
            raise UsageError(
                f"privacy event of population_size {event.population_size}; the accountant's "
                f"PrivacyConfig has {self._config.population_size}"
            )


class _DpAccounting(NamedTuple):
    """The three dp-accounting modules the accountant uses."""

    dp_event: ModuleType
    privacy_accountant: ModuleType
    rdp: ModuleType


def _import_dp_accounting() -> _DpAccounting:
    try:
        return _DpAccounting(
            importlib.import_module("dp_accounting.dp_event"),
            importlib.import_module("dp_accounting.privacy_accountant"),
            importlib.import_module("dp_accounting.rdp"),
        )
    except ImportError as exc:
        raise ImportError(
            f"RdpAccountant needs Google's dp-accounting: {DP_EXTRA}", name="dp_accounting"
        ) from exc


def _composition(item: object) -> tuple[GaussianPrivacyEvent, int]:
    table = _table(item)
    count = table["count"]
    _check_count("count", count)
    return GaussianPrivacyEvent(**_table(table["event"])), count


def _table(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a table, got {type(value).__name__}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _member(kind: type[Enum], name: str, value: object) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in kind)
        raise UsageError(f"{name} must be one of {choices}; got {value!r}") from None


def _checked_orders(orders: tuple[float, ...]) -> tuple[float, ...]:
    if not orders:
        raise UsageError("RDP orders must not be empty")
    if any(_finite("each RDP order", order) <= 1 for order in orders):
        raise UsageError(f"each RDP order must be greater than 1; got {orders!r}")
    return tuple(float(order) for order in orders)


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive integer; got {value!r}")


def _check_probability(name: str, value: object) -> None:
    if not 0 < _finite(name, value) < 1:
        raise UsageError(f"{name} must be strictly between 0 and 1; got {value!r}")


def _check_positive(name: str, value: object) -> None:
    if _finite(name, value) <= 0:
        raise UsageError(f"{name} must be greater than 0; got {value!r}")


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number; got {value!r}")
    return float(value)
