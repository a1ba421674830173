"""The privacy accountant: dp-accounting's numbers, Flower's API, dp-accounting loaded when used."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from fedcore.errors import UsageError
from fedcore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
    RdpAccountant,
    SamplingMethod,
)

try:
    import dp_accounting
except ImportError:  # the tests that need it skip; the ones of its absence still run
    dp_accounting = None

needs_dp = pytest.mark.skipif(dp_accounting is None, reason="pip install 'fedcore[dp]'")

ADD_OR_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
POPULATION = 60_000


def poisson(**overrides: object) -> PrivacyConfig:
    fields: dict[str, object] = {
        "target_delta": 1e-5,
        "population_size": POPULATION,
        "neighboring_relation": ADD_OR_REMOVE,
        "sampling_method": SamplingMethod.POISSON,
    }
    return PrivacyConfig(**{**fields, **overrides})  # type: ignore[arg-type]


def event(noise: float = 1.1, sample: int = 256) -> GaussianPrivacyEvent:
    return GaussianPrivacyEvent(
        noise_multiplier=noise, sample_size=sample, population_size=POPULATION
    )


# ------------------------------------------------------------------ dp-accounting's numbers


@needs_dp
def test_a_poisson_sampled_gaussian_costs_what_dp_accounting_says() -> None:
    """DP-SGD's MNIST setting (q = 256/60000, sigma = 1.1), 1000 steps then 14 062 in all."""
    ours = RdpAccountant(poisson())
    theirs = dp_accounting.rdp.RdpAccountant()
    sampled = dp_accounting.PoissonSampledDpEvent(
        256 / POPULATION, dp_accounting.GaussianDpEvent(1.1)
    )

    ours.compose(event(), 1000)
    theirs.compose(sampled, 1000)
    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)
    assert ours.get_delta(1.0) == theirs.get_delta(1.0)

    ours.compose(event(), 13_062)
    theirs.compose(sampled, 13_062)
    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)
    assert 2.5 < ours.get_epsilon(1e-5) < 3.5  # the (about 3, 1e-5) of 60 epochs


@needs_dp
def test_a_gaussian_without_amplification_is_exactly_one_one_in_a_million_dp() -> None:
    """dp-accounting's own case: noise 4.530877117 gives (1, 1e-6)-DP for one release
    seen by everyone (its orders 1 to 100 by 0.001)."""
    config = poisson(target_delta=1e-6, sampling_method=SamplingMethod.NO_AMPLIFICATION)
    orders = tuple(0.001 * i for i in range(1001, 100_000))
    accountant = RdpAccountant(config, orders=orders)

    accountant.compose(event(noise=4.530877117, sample=10))

    assert accountant.get_epsilon(1e-6) == pytest.approx(1.0, abs=1e-6)
    assert accountant.get_delta(1.0) == pytest.approx(1e-6, rel=1e-5)


@needs_dp
def test_sampling_without_replacement_is_accounted_for_replaced_neighbours() -> None:
    config = poisson(
        sampling_method=SamplingMethod.WITHOUT_REPLACEMENT,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    )
    ours = RdpAccountant(config)
    theirs = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )

    ours.compose(event(noise=1.3, sample=600), 50)
    theirs.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            POPULATION, 600, dp_accounting.GaussianDpEvent(1.3)
        ),
        50,
    )

    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)


@needs_dp
def test_composing_with_a_count_is_composing_that_many_times() -> None:
    once, each = RdpAccountant(poisson()), RdpAccountant(poisson())

    once.compose(event(), 5)
    for _ in range(5):
        each.compose(event())

    assert once.num_releases == each.num_releases == 5
    assert once.get_epsilon(1e-5) == pytest.approx(each.get_epsilon(1e-5), rel=1e-12)


@needs_dp
def test_the_privacy_spent_is_reported_at_the_target_delta_unless_asked() -> None:
    accountant = RdpAccountant(poisson())
    accountant.compose(event(), 100)

    spent = accountant.get_privacy_spent()
    at_other = accountant.get_privacy_spent(delta=1e-3)

    assert isinstance(spent, PrivacySpent)
    assert (spent.delta, spent.num_releases, spent.accounting_method) == (1e-5, 100, "rdp")
    assert spent.epsilon == accountant.get_epsilon(1e-5)
    assert spent.optimal_order in accountant.state_dict()["orders"]  # type: ignore[operator]
    assert at_other.delta == 1e-3
    assert at_other.epsilon < spent.epsilon


@needs_dp
def test_an_accountant_is_a_privacy_accountant() -> None:
    accountant: PrivacyAccountant = RdpAccountant(poisson())

    assert accountant.config == poisson()
    assert accountant.num_releases == 0
    assert accountant.get_epsilon(1e-5) == 0.0


# ------------------------------------------------------------------ the budget


@needs_dp
def test_would_exceed_looks_ahead_without_spending() -> None:
    accountant = RdpAccountant(poisson(max_epsilon=1.0))
    accountant.compose(event(), 1000)  # about 0.89
    before = accountant.state_dict()

    assert accountant.would_exceed(event()) is False
    assert accountant.would_exceed(event(), count=1000) is True
    assert accountant.would_exceed(event(), max_epsilon=5.0, count=1000) is False

    assert accountant.state_dict() == before
    assert accountant.num_releases == 1000


@needs_dp
def test_would_exceed_needs_a_budget() -> None:
    accountant = RdpAccountant(poisson())

    with pytest.raises(UsageError, match="would_exceed needs an epsilon budget"):
        accountant.would_exceed(event())
    with pytest.raises(UsageError, match="max_epsilon must be greater than 0"):
        accountant.would_exceed(event(), max_epsilon=0.0)


# ------------------------------------------------------------------ state


@needs_dp
def test_an_accountant_goes_on_from_its_state_dict_written_as_json() -> None:
    first = RdpAccountant(poisson(max_epsilon=8.0), orders=(2.0, 4.0, 8.0, 16.0, 32.0))
    first.compose(event(), 300)
    first.compose(event(noise=0.9, sample=512), 20)

    state = json.loads(json.dumps(first.state_dict()))
    second = RdpAccountant(poisson(max_epsilon=8.0))
    second.load_state_dict(state)

    assert second.num_releases == 320
    assert second.state_dict() == first.state_dict()
    assert second.get_epsilon(1e-5) == first.get_epsilon(1e-5)
    assert second.get_privacy_spent().optimal_order in (2.0, 4.0, 8.0, 16.0, 32.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 2}, "schema version 2"),
        ({"backend": "pld"}, "written by a 'pld' accountant"),
        ({"orders": [1.0]}, "each RDP order must be greater than 1"),
        ({"orders": "2,4"}, "cannot be read: expected a list"),
        ({"compositions": [{"event": {"noise_multiplier": 1.0}, "count": 1}]}, "cannot be read"),
        ({"compositions": [{"event": event().__dict__, "count": 0}]}, "count must be a positive"),
        ({"config": {"target_delta": 1e-5}}, "cannot be read"),
    ],
)
@needs_dp
def test_a_state_that_cannot_be_read_is_refused_and_changes_nothing(
    change: dict[str, object], message: str
) -> None:
    accountant = RdpAccountant(poisson())
    accountant.compose(event(), 7)
    state = {**accountant.state_dict(), **change}
    before = accountant.state_dict()

    with pytest.raises(UsageError, match=message):
        accountant.load_state_dict(state)

    assert accountant.state_dict() == before


@needs_dp
def test_a_state_written_under_another_config_is_refused() -> None:
    written = RdpAccountant(poisson(target_delta=1e-6)).state_dict()

    with pytest.raises(UsageError, match="accountant state written under"):
        RdpAccountant(poisson()).load_state_dict(written)


# ------------------------------------------------------------------ what is checked


@pytest.mark.parametrize(
    ("method", "relation"),
    [
        (SamplingMethod.POISSON, NeighboringRelation.REPLACE_ONE),
        (SamplingMethod.WITHOUT_REPLACEMENT, NeighboringRelation.ADD_OR_REMOVE_ONE),
        (SamplingMethod.NO_AMPLIFICATION, NeighboringRelation.REPLACE_ONE),
    ],
)
def test_a_sampling_model_without_its_bound_is_refused(
    method: SamplingMethod, relation: NeighboringRelation
) -> None:
    with pytest.raises(UsageError, match="privacy accounting has no model for"):
        poisson(sampling_method=method, neighboring_relation=relation)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target_delta": 1.0}, "target_delta must be strictly between 0 and 1"),
        ({"target_delta": math.nan}, "target_delta must be a finite number"),
        ({"population_size": 0}, "population_size must be a positive integer"),
        ({"population_size": True}, "population_size must be a positive integer"),
        ({"max_epsilon": -1.0}, "max_epsilon must be greater than 0"),
        ({"sampling_method": "uniform"}, "sampling_method must be one of 'poisson'"),
    ],
)
def test_a_bad_config_is_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        poisson(**overrides)


def test_the_models_names_may_be_given_as_text() -> None:
    """As a run config holds them; Flower's stores the text and fails at compose."""
    config = poisson(sampling_method="poisson", neighboring_relation="add-or-remove-one")

    assert config == poisson()
    assert config.sampling_method is SamplingMethod.POISSON
    assert str(SamplingMethod.POISSON) == "poisson"  # StrEnum's (Flower's: the member's name)


@needs_dp
def test_a_bad_event_or_count_is_refused() -> None:
    accountant = RdpAccountant(poisson())

    with pytest.raises(UsageError, match="sample_size 11 is larger than population_size 10"):
        GaussianPrivacyEvent(1.0, 11, 10)
    with pytest.raises(UsageError, match="noise_multiplier must be greater than 0"):
        GaussianPrivacyEvent(0.0, 1, 10)
    with pytest.raises(UsageError, match="population_size 10; the accountant's PrivacyConfig"):
        accountant.compose(GaussianPrivacyEvent(1.0, 1, 10))
    with pytest.raises(UsageError, match="count must be a positive integer"):
        accountant.compose(event(), 0)
    with pytest.raises(UsageError, match="delta must be strictly between 0 and 1"):
        accountant.get_epsilon(0.0)
    with pytest.raises(UsageError, match="epsilon must be at least 0"):
        accountant.get_delta(-0.5)
    with pytest.raises(UsageError, match="RDP orders must not be empty"):
        RdpAccountant(poisson(), orders=())
    assert accountant.num_releases == 0


# ------------------------------------------------------------------ without dp-accounting


def test_without_dp_accounting_making_an_accountant_says_which_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # as if it were not installed
    for name in [n for n in sys.modules if n.startswith("dp_accounting.")]:
        monkeypatch.setitem(sys.modules, name, None)
    config = poisson()  # the types need nothing

    with pytest.raises(ImportError) as caught:
        RdpAccountant(config)

    assert str(caught.value) == (
        "RdpAccountant needs Google's dp-accounting: pip install 'fedcore[dp]'"
    )
    assert caught.value.name == "dp_accounting"


def test_naming_the_accounting_types_in_an_app_imports_no_dp_accounting() -> None:
    """An app that imports the accountant without making one, through Flower's names."""
    code = (
        "import sys\n"
        "from fedcore.apps.flower_imports import install_flower_imports\n"
        "install_flower_imports()\n"
        "from flwr.serverapp import Grid, PrivacyConfig, RdpAccountant, ServerApp\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dp_accounting'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    assert done.stdout.strip() == "[]"
