"""The ``flwr`` shim: each table name is fedcore's object, and a missing one fails at import."""

from __future__ import annotations

import importlib
import logging
import sys
import typing
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

import fedcore
import fedcore.apps.client_app
import fedcore.legacy.client_app
import fedcore.legacy.server_app
import fedcore.mods
import fedcore.strategy
import fedcore.strategy.base
from fedcore import clock, errors, privacy_accounting
from fedcore.apps import flower_imports, run_config
from fedcore.apps.flower_imports import FLOWER_NAMES, install_flower_imports
from fedcore.domain import array, message, records
from fedcore.errors import AppLoadError, FlowerImportError
from fedcore.testing.clock import FakeClock
from fedcore.testing.flower_names import (
    APP_MODULES,
    LEGACY_KEYWORDS,
    FlowerWheel,
    example_imports,
    flower_wheel,
    forget_flower_imports,
    kind_of,
    uses_legacy_api,
)

# What Flower's example apps import: these resolve today.
USED_BY_APPS = {
    "flwr.app": {
        "ArrayRecord": fedcore.ArrayRecord,
        "ConfigRecord": fedcore.ConfigRecord,
        "Context": fedcore.Context,
        "Message": fedcore.Message,
        "MetricRecord": fedcore.MetricRecord,
        "RecordDict": fedcore.RecordDict,
    },
    # fedcore's ServerApp, taking Flower's legacy server_fn too (fedcore.legacy)
    "flwr.serverapp": {"Grid": fedcore.Grid, "ServerApp": fedcore.legacy.server_app.ServerApp},
    "flwr.serverapp.strategy": {
        "FedAvg": fedcore.strategy.FedAvg,
        "Result": fedcore.strategy.Result,
    },
    "flwr.serverapp.strategy.strategy_utils": {
        "log_strategy_start_info": fedcore.strategy.base.log_strategy_start_info,
    },
    # fedcore's ClientApp, taking Flower's legacy client_fn too (fedcore.legacy)
    "flwr.clientapp": {"ClientApp": fedcore.legacy.client_app.ClientApp},
    "flwr.clientapp.mod": {"fixedclipping_mod": fedcore.mods.fixedclipping_mod},
    "flwr.client.typing": {
        "Mod": fedcore.apps.client_app.Mod,
        "ClientAppCallable": fedcore.apps.client_app.CallNext,
    },
    "flwr.common": {
        "NDArrays": array.NDArrays,
        "log": flower_imports.log,
        "now": clock.utc_now,
        "DEFAULT_TTL": message.DEFAULT_TTL,
    },
    "flwr.common.logger": {"log": flower_imports.log},
    "flwr.common.config": {"unflatten_dict": run_config.unflatten},
    # quickstart-catboost and quickstart-mlx: Flower's older spelling of flwr.serverapp's.
    "flwr.server": {"Grid": fedcore.Grid, "ServerApp": fedcore.legacy.server_app.ServerApp},
}


@pytest.fixture(autouse=True)
def shim() -> Iterator[None]:
    """The shim installed afresh for each test, and gone after it."""
    forget_flower_imports()
    install_flower_imports()
    yield
    forget_flower_imports()


@pytest.mark.parametrize("module", sorted(USED_BY_APPS))
def test_the_names_apps_import_are_fedcores_own(module: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import {', '.join(USED_BY_APPS[module])}", namespace)

    for name, expected in USED_BY_APPS[module].items():
        assert namespace[name] is expected, f"{module}.{name}"


def test_every_table_entry_is_fedcores_object() -> None:
    for module, names in FLOWER_NAMES.items():
        shim = importlib.import_module(module)
        for name, target in names.items():
            home, _, attr = target.partition(":")
            expected = getattr(importlib.import_module(home), attr)
            assert getattr(shim, name) is expected, f"{module}.{name}"


@pytest.fixture(scope="module")
def wheel() -> FlowerWheel:
    """Flower's own wheel, from which the public names are read (never imported)."""
    try:
        return flower_wheel()
    except LookupError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("module", APP_MODULES)
def test_every_public_name_of_flowers_app_modules_is_served(
    wheel: FlowerWheel, module: str
) -> None:
    """Each name in the ``__all__`` of Flower's wheel: one Flower adds fails here."""
    shim = importlib.import_module(module)
    names = wheel.public_names(module)
    assert names, module

    missing = [name for name in names if not _served(shim, name)]

    assert missing == [], f"{module}: Flower's public names fedcore does not serve: {missing}"


def _served(shim: ModuleType, name: str) -> bool:
    try:
        getattr(shim, name)
    except (ImportError, AttributeError):
        return False
    return True


@pytest.mark.parametrize("module", APP_MODULES)
def test_each_served_name_is_the_kind_of_thing_flowers_is(wheel: FlowerWheel, module: str) -> None:
    """Class for class, function for function, constant, type alias or module alike."""
    shim = importlib.import_module(module)
    kinds = {name: wheel.kind(module, name) for name in wheel.public_names(module)}
    known = {name: kind for name, kind in kinds.items() if kind is not None}
    assert len(known) == len(kinds), f"kinds the wheel reader cannot tell: {kinds}"

    ours = {name: kind_of(getattr(shim, name)) for name in known}

    assert ours == known


def test_the_wheel_reader_tells_kinds_apart(wheel: FlowerWheel) -> None:
    """The kind check above can fail: the reader sees each kind in Flower's source."""
    assert wheel.kind("flwr.app", "ArrayRecord") == "class"
    assert wheel.kind("flwr.app", "DEFAULT_TTL") == "constant"
    assert wheel.kind("flwr.app", "MetricScalar") == "type alias"
    assert wheel.kind("flwr.clientapp.mod", "fixedclipping_mod") == "function"
    assert wheel.kind("flwr.serverapp", "strategy") == "module"
    assert wheel.kind("flwr.serverapp", "RdpAccountant") == "class"  # only imported lazily


NOT_SERVED_YET = {
    "fl-dp-sa": {
        "flwr.client.mod.fixedclipping_mod",
        "flwr.client.mod.secaggplus_mod",
        "flwr.server.workflow.SecAggPlusWorkflow",
    },
    "flower-secure-aggregation": {
        "flwr.client.mod.secaggplus_mod",
        "flwr.common.logger.update_console_handler",
        "flwr.common.secure_aggregation.quantization.quantize",
        "flwr.server.workflow.SecAggPlusWorkflow",
        "flwr.server.workflow.secure_aggregation.secaggplus_workflow.SecAggPlusWorkflow",
        "flwr.server.workflow.secure_aggregation.secaggplus_workflow.WorkflowState",
    },
}
"""The two examples of Flower's secure aggregation (SecAgg+), which fedcore does not
serve (docs/from-flower.md), and the names they need for it."""


def test_every_flwr_name_an_example_imports_is_served() -> None:
    """Flower's example apps at FLOWER_COMMIT, read statically: each ``flwr`` name an app
    refers to resolves, of the Message API and of the legacy API alike, but for
    :data:`NOT_SERVED_YET`'s (an entry that resolves fails too: it is stale)."""
    try:
        apps = example_imports()
    except LookupError as exc:
        pytest.skip(f"{exc} (tests/flower_apps)")
    legacy = {app for app, refs in apps.items() if uses_legacy_api(refs)}
    assert {"quickstart-xgboost", "xgboost-comprehensive", "quickstart-catboost"}.isdisjoint(legacy)
    assert {"flower-simulation-step-by-step-pytorch", "quickstart-lerobot"} <= legacy

    unserved = {
        app: {ref for ref in refs if ref not in LEGACY_KEYWORDS and not _reachable(ref)}
        for app, refs in sorted(apps.items())
    }

    assert {app: refs for app, refs in unserved.items() if refs} == NOT_SERVED_YET


def _reachable(dotted: str) -> bool:
    """Whether ``import`` then attribute access reaches ``dotted`` (``flwr.a.b.C``)."""
    head, *rest = dotted.split(".")
    try:
        value: object = importlib.import_module(head)
        for part in rest:
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return False
    return True


def test_flwr_common_now_is_the_clock_s_time_in_utc() -> None:
    from flwr.common import now

    before = datetime.now(UTC)
    stamp = now()

    assert stamp.tzinfo is UTC
    assert before <= stamp <= datetime.now(UTC)
    assert clock.utc_now(FakeClock(1_700_000_000.0)) == datetime(
        2023, 11, 14, 22, 13, 20, tzinfo=UTC
    )


def test_the_record_value_types_are_flowers() -> None:
    """``flwr.app``'s value aliases admit what Flower's do (checked on their members)."""
    from flwr.app import (
        ConfigRecordValues,
        ConfigScalar,
        ConfigScalarList,
        MetricRecordValues,
        MetricScalar,
        MetricScalarList,
    )

    assert set(typing.get_args(MetricScalar)) == {int, float}
    assert set(typing.get_args(MetricScalarList)) == {list[int], list[float]}
    assert set(typing.get_args(ConfigScalar)) == {int, float, str, bytes, bool}
    assert set(typing.get_args(ConfigScalarList)) == {
        list[int], list[float], list[str], list[bytes], list[bool]
    }  # fmt: skip
    assert MetricRecordValues is records.MetricValue
    assert ConfigRecordValues is records.ConfigValue


def test_the_privacy_accounting_names_are_fedcores() -> None:
    namespace: dict[str, object] = {}
    exec(
        "from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, "
        "PrivacyAccountant, PrivacyConfig, PrivacySpent, RdpAccountant, SamplingMethod",
        namespace,
    )

    for name in (
        "GaussianPrivacyEvent", "NeighboringRelation", "PrivacyAccountant", "PrivacyConfig",
        "PrivacySpent", "RdpAccountant", "SamplingMethod",
    ):  # fmt: skip
        assert namespace[name] is getattr(privacy_accounting, name)


def test_every_strategy_utils_helper_is_served() -> None:
    """Flower 1.42's public ``strategy_utils`` functions, each from fedcore's module of
    its concept (tests/strategy/test_strategy_utils.py checks what they do)."""
    from fedcore.strategy import aggregate, fedavg, sampling, xgboost_trees

    namespace: dict[str, object] = {}
    exec(
        "from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords, "
        "aggregate_bagging, aggregate_metricrecords, config_to_str, log_strategy_start_info, "
        "sample_nodes, validate_message_reply_consistency\n"
        "from flwr.serverapp.exception import InconsistentMessageReplies",
        namespace,
    )

    assert namespace["aggregate_arrayrecords"] is aggregate.aggregate_arrayrecords
    assert namespace["aggregate_metricrecords"] is aggregate.aggregate_metricrecords
    assert namespace["aggregate_bagging"] is xgboost_trees.bag
    assert namespace["config_to_str"] is fedcore.strategy.base.config_to_str
    assert namespace["log_strategy_start_info"] is fedcore.strategy.base.log_strategy_start_info
    assert namespace["sample_nodes"] is sampling.sample_nodes
    assert (
        namespace["validate_message_reply_consistency"] is fedavg.validate_message_reply_consistency
    )
    assert namespace["InconsistentMessageReplies"] is errors.InconsistentRepliesError


def test_the_exceptions_strategies_raise_and_the_mod_types_are_served() -> None:
    """``AggregationError`` (a server optimizer's refused aggregate) and
    ``flwr.clientapp.typing``, where Flower's guide to mods imports their types from."""
    namespace: dict[str, object] = {}
    exec(
        "from flwr.serverapp.exception import AggregationError\n"
        "from flwr.clientapp.typing import ClientAppCallable, Mod",
        namespace,
    )

    assert namespace["AggregationError"] is errors.AggregationError
    assert namespace["ClientAppCallable"] is fedcore.mods.ClientAppCallable
    assert namespace["Mod"] is fedcore.mods.Mod


def test_flwr_common_logger_is_a_module_with_log() -> None:
    """advanced-pytorch: ``from flwr.common import log, logger`` then ``logger.log(...)``."""
    namespace: dict[str, object] = {}
    exec("from flwr.common import log, logger", namespace)

    assert namespace["log"] is flower_imports.log
    assert isinstance(namespace["logger"], ModuleType)
    assert namespace["logger"].log is flower_imports.log  # type: ignore[attr-defined]


def test_import_flwr_reaches_submodules_as_attributes() -> None:
    import flwr

    assert flwr.serverapp.strategy.FedAvg is fedcore.strategy.FedAvg
    assert flwr.common.logger.log is flower_imports.log


def test_a_name_not_in_the_table_fails_at_the_import_statement() -> None:
    with pytest.raises(FlowerImportError) as caught:
        exec("from flwr.common import EventType", {})

    assert str(caught.value) == (
        "flwr.common.EventType is a Flower name that fedcore does not support yet"
    )
    assert isinstance(caught.value, ImportError)
    assert isinstance(caught.value, AppLoadError)


def test_a_module_not_in_the_table_fails_at_the_import_statement() -> None:
    with pytest.raises(FlowerImportError, match=r"^flwr\.superlink is a Flower name"):
        importlib.import_module("flwr.superlink")
    with pytest.raises(FlowerImportError, match=r"^flwr\.supernode is a Flower name"):
        exec("from flwr import supernode", {})


def test_a_planned_name_fails_only_when_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = {"Later": "fedcore:NoSuchNameYet", "Elsewhere": "fedcore.no_such_module:X"}
    monkeypatch.setitem(FLOWER_NAMES, "flwr.app", {**FLOWER_NAMES["flwr.app"], **planned})

    exec("from flwr.app import ArrayRecord", {})  # the module and its other names load
    for name in planned:
        with pytest.raises(FlowerImportError, match=f"^flwr.app.{name} is a Flower name"):
            exec(f"from flwr.app import {name}", {})


def test_a_fedcore_module_that_fails_otherwise_is_not_called_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fcshim_needs_extra.py").write_text("import fcshim_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(FLOWER_NAMES, "flwr.app", {"Needy": "fcshim_needs_extra:X"})

    with pytest.raises(ModuleNotFoundError) as caught:
        exec("from flwr.app import Needy", {})

    assert not isinstance(caught.value, FlowerImportError)
    assert caught.value.name == "fcshim_absent_dependency"


def test_dunder_probes_get_attribute_errors() -> None:
    import flwr.app

    assert not hasattr(flwr.app, "__wrapped__")
    assert flwr.app.__all__ == sorted(FLOWER_NAMES["flwr.app"])


def test_log_logs_on_the_flwr_logger_at_the_level_given(caplog: pytest.LogCaptureFixture) -> None:
    from flwr.common.logger import log

    with caplog.at_level(logging.DEBUG, logger="flwr"):
        log(logging.WARNING, "round %s of %s", 2, 5)

    [record] = caplog.records
    assert (record.name, record.levelno, record.getMessage()) == (
        "flwr",
        logging.WARNING,
        "round 2 of 5",
    )
    assert record.pathname == __file__  # the caller's line, not the shim's


def test_a_flower_already_imported_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    forget_flower_imports()
    flower = ModuleType("flwr")  # as if Flower itself had been imported
    sys.modules["flwr"] = flower

    with caplog.at_level(logging.WARNING):
        install_flower_imports()

    assert not any(type(f).__name__ == "_FlowerFinder" for f in sys.meta_path)
    assert sys.modules["flwr"] is flower
    assert "flwr (Flower) is already imported in this process" in caplog.text
