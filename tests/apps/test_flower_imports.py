"""The ``flwr`` shim: each table name is fedcore's object, and a missing one fails at import."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import fedcore
import fedcore.apps.client_app
import fedcore.mods
import fedcore.strategy
import fedcore.strategy.base
from fedcore import errors
from fedcore.apps import flower_imports
from fedcore.apps.flower_imports import FLOWER_NAMES, install_flower_imports
from fedcore.domain import records
from fedcore.errors import AppLoadError, FlowerImportError

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
    "flwr.serverapp": {"Grid": fedcore.Grid, "ServerApp": fedcore.ServerApp},
    "flwr.serverapp.strategy": {
        "FedAvg": fedcore.strategy.FedAvg,
        "Result": fedcore.strategy.Result,
    },
    "flwr.serverapp.strategy.strategy_utils": {
        "log_strategy_start_info": fedcore.strategy.base.log_strategy_start_info,
    },
    "flwr.clientapp": {"ClientApp": fedcore.ClientApp},
    "flwr.clientapp.mod": {"fixedclipping_mod": fedcore.mods.fixedclipping_mod},
    "flwr.client.typing": {
        "Mod": fedcore.apps.client_app.Mod,
        "ClientAppCallable": fedcore.apps.client_app.CallNext,
    },
    "flwr.common": {"NDArrays": records.NDArrays, "log": flower_imports.log},
    "flwr.common.logger": {"log": flower_imports.log},
}


def _forget() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_FlowerFinder"]
    for name in [n for n in sys.modules if n == "flwr" or n.startswith("flwr.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def shim() -> Iterator[None]:
    """The shim installed afresh for each test, and gone after it."""
    _forget()
    install_flower_imports()
    yield
    _forget()


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


def test_every_public_name_of_the_flower_modules_apps_use_is_served() -> None:
    """The public names (``__all__``) of Flower 1.42's app-facing modules."""
    public = {
        "flwr.app": {"Array", "ArrayRecord", "ConfigRecord", "Context", "Error", "Message",
                     "MessageType", "Metadata", "MetricRecord", "RecordDict", "UserConfig",
                     "UserConfigValue"},
        "flwr.serverapp": {"Grid", "ServerApp"},
        "flwr.clientapp": {"ClientApp"},
        "flwr.clientapp.mod": {"LocalDpMod", "adaptiveclipping_mod", "arrays_size_mod",
                               "fixedclipping_mod", "message_size_mod"},
    }  # fmt: skip
    strategies = {name for name in fedcore.strategy.__all__ if name[0].isupper()}
    for module, names in public.items():
        assert names <= FLOWER_NAMES[module].keys(), module
    assert len(FLOWER_NAMES["flwr.serverapp.strategy"]) == 20
    assert FLOWER_NAMES["flwr.serverapp.strategy"].keys() <= strategies


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
        exec("from flwr.common import FitIns", {})

    assert (
        str(caught.value) == "flwr.common.FitIns is a Flower name that fedcore does not support yet"
    )
    assert isinstance(caught.value, ImportError)
    assert isinstance(caught.value, AppLoadError)


def test_a_module_not_in_the_table_fails_at_the_import_statement() -> None:
    with pytest.raises(FlowerImportError, match=r"^flwr\.simulation is a Flower name"):
        importlib.import_module("flwr.simulation")
    with pytest.raises(FlowerImportError, match=r"^flwr\.server is a Flower name"):
        exec("from flwr import server", {})


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
    _forget()
    flower = ModuleType("flwr")  # as if Flower itself had been imported
    sys.modules["flwr"] = flower

    with caplog.at_level(logging.WARNING):
        install_flower_imports()

    assert not any(type(f).__name__ == "_FlowerFinder" for f in sys.meta_path)
    assert sys.modules["flwr"] is flower
    assert "flwr (Flower) is already imported in this process" in caplog.text
