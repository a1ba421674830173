"""``import flwr…`` in an app, answered by fedcore: Flower's public names mapped onto fedcore's.

A Flower app runs as it is because its ``flwr`` imports are answered with fedcore's
objects: :func:`install_flower_imports` puts a finder first on ``sys.meta_path`` that
serves every ``flwr`` module of :data:`FLOWER_NAMES`, the one table of ``flwr``
modules, their names and the fedcore object behind each. App loading installs it, so
it is in place only in processes that import an app; fedcore ships no ``flwr``
package and no ``.pth`` file. A name is resolved when first imported, so an app pays
for what it uses, and a name fedcore lacks fails at the import with a
:class:`FlowerImportError` naming it, not rounds later. Where Flower itself is already
imported, the finder is not installed and a warning says the app gets Flower's objects.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

from fedcore.apps.flower_legacy_names import LEGACY_NAMES
from fedcore.errors import FlowerImportError, UsageError

_MARK = "__fedcore_flower__"

_DOMAIN = ("ArrayRecord", "ConfigRecord", "Context", "Error", "Message", "Metadata")
_RECORDS = ("MetricRecord", "RecordDict")
_APP_TYPES = ("Array", "MessageType", "UserConfig", "UserConfigValue")
_STRATEGIES = (
    "Bulyan",
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "DifferentialPrivacyServerSideFixedClipping",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedMedian",
    "FedProx",
    "FedTrimmedAvg",
    "FedXgbBagging",
    "FedXgbCyclic",
    "FedYogi",
    "Krum",
    "MultiKrum",
    "QFedAvg",
    "Result",
    "Strategy",
)
_MODS = (
    "LocalDpMod",
    "adaptiveclipping_mod",
    "arrays_size_mod",
    "fixedclipping_mod",
    "message_size_mod",
)
_ARRAY_TYPES = {
    "NDArray": "fedcore.domain.array:NDArray",
    "NDArrays": "fedcore.domain.array:NDArrays",
}
_MOD_TYPES = {
    "ClientAppCallable": "fedcore.mods:ClientAppCallable",
    "Mod": "fedcore.mods:Mod",
}
_LOG = {"log": "fedcore.apps.flower_imports:log"}
_VALUE_TYPES = {
    name: f"fedcore.domain.records:{name}"
    for name in (
        "ConfigRecordValues",
        "ConfigScalar",
        "ConfigScalarList",
        "MetricRecordValues",
        "MetricScalar",
        "MetricScalarList",
    )
}
_TTL = {"DEFAULT_TTL": "fedcore.domain.message:DEFAULT_TTL"}
_PRIVACY_ACCOUNTING = {
    name: f"fedcore.privacy_accounting:{name}"
    for name in (
        "GaussianPrivacyEvent",
        "NeighboringRelation",
        "PrivacyAccountant",
        "PrivacyConfig",
        "PrivacySpent",
        "RdpAccountant",
        "SamplingMethod",
    )
}
_STRATEGY_UTILS = {
    "aggregate_arrayrecords": "fedcore.strategy.aggregate:aggregate_arrayrecords",
    "aggregate_bagging": "fedcore.strategy.xgboost_trees:bag",
    "aggregate_metricrecords": "fedcore.strategy.aggregate:aggregate_metricrecords",
    "config_to_str": "fedcore.strategy.base:config_to_str",
    "log_strategy_start_info": "fedcore.strategy.base:log_strategy_start_info",
    "sample_nodes": "fedcore.strategy.sampling:sample_nodes",
    "validate_message_reply_consistency": (
        "fedcore.strategy.fedavg:validate_message_reply_consistency"
    ),
}


def _top(names: Sequence[str]) -> dict[str, str]:
    return {name: f"fedcore:{name}" for name in names}


FLOWER_NAMES: dict[str, dict[str, str]] = {
    "flwr": {},
    "flwr.app": {**_top((*_DOMAIN, *_RECORDS, *_APP_TYPES)), **_VALUE_TYPES, **_TTL},
    "flwr.serverapp": {**_top(("Grid", "ServerApp")), **_PRIVACY_ACCOUNTING},
    "flwr.serverapp.strategy": {name: f"fedcore.strategy:{name}" for name in _STRATEGIES},
    "flwr.serverapp.strategy.strategy_utils": _STRATEGY_UTILS,
    "flwr.serverapp.exception": {
        "AggregationError": "fedcore.errors:AggregationError",
        "InconsistentMessageReplies": "fedcore.errors:InconsistentRepliesError",
    },
    "flwr.clientapp": _top(("ClientApp",)),
    "flwr.clientapp.mod": {name: f"fedcore.mods:{name}" for name in _MODS},
    "flwr.clientapp.typing": _MOD_TYPES,
    "flwr.client": _top(("ClientApp",)),
    "flwr.client.typing": _MOD_TYPES,
    "flwr.server": _top(("Grid", "ServerApp")),
    "flwr.common": {
        **_top((*_DOMAIN, *_RECORDS, "Array", "MessageType")),
        **_ARRAY_TYPES,
        **_LOG,
        **_TTL,
        "ConfigRecordValues": _VALUE_TYPES["ConfigRecordValues"],
        "MetricRecordValues": _VALUE_TYPES["MetricRecordValues"],
        "now": "fedcore.clock:utc_now",
    },
    "flwr.common.config": {"unflatten_dict": "fedcore.apps.run_config:unflatten"},
    "flwr.common.logger": _LOG,
    # Not in Flower's __all__, but where its users (and its own Message tests) take them.
    "flwr.common.message": {
        "DEFAULT_TTL": _TTL["DEFAULT_TTL"],
        "MessageInitializationError": "fedcore.errors:MessageInitializationError",
        "make_message": "fedcore.domain.message:assemble_message",
    },
    "flwr.common.typing": {**_ARRAY_TYPES, **_top(("UserConfig", "UserConfigValue"))},
}
"""Each ``flwr`` module fedcore serves -> each of its names -> the fedcore ``module:attr``.

A module's submodules are the table's other keys under it (``flwr.serverapp.strategy``
is ``flwr.serverapp``'s ``strategy``).
"""

# Flower's legacy API (NumPyClient, flwr.server.strategy, ServerApp(server_fn=…), …).
for _module, _names in LEGACY_NAMES.items():
    FLOWER_NAMES.setdefault(_module, {}).update(_names)


_WIRE = (
    "talks Flower's own wire protocol, which fedcore does not speak, so calling it fails: "
    "run the app with `fedcore run` on a fedcore link, or `fedcore simulate`"
)
OUT_OF_SCOPE: dict[str, str] = {  # importing one logs this line; calling it raises it
    "flwr.server.start_server": _WIRE,
    "flwr.client.start_client": _WIRE,
    "flwr.client.start_numpy_client": _WIRE,
}
"""Flower names fedcore will not serve, and why (:func:`out_of_scope`)."""

_flower_log = logging.getLogger("flwr")


def log(level: int, msg: object, *args: object, **kwargs: Any) -> None:
    """Flower's ``flwr.common.logger.log(level, msg, *args)``: a record at ``level``.

    On the ``flwr`` logger, as Flower's, so an app that tunes that logger keeps doing
    so; the record names the app's line, not this one.
    """
    kwargs.setdefault("stacklevel", 2)
    _flower_log.log(level, msg, *args, **kwargs)


def install_flower_imports() -> None:
    """Answer this process's ``import flwr…`` with fedcore's names, from now on; idempotent."""
    if any(isinstance(finder, _FlowerFinder) for finder in sys.meta_path):
        return
    present = sys.modules.get("flwr")
    if present is not None and not getattr(present, _MARK, False):
        logging.getLogger(__name__).warning(
            "flwr (Flower) is already imported in this process, so the app's `import flwr` "
            "statements get Flower's objects, not fedcore's; load the app in a process of "
            "its own (fedcore simulate, fedcore run) to have fedcore's"
        )
        return
    sys.meta_path.insert(0, _FlowerFinder())


def unsupported(name: str) -> FlowerImportError:
    """The error for the Flower name (module or ``module.attr``) ``name``."""
    return FlowerImportError(f"{name} is a Flower name that fedcore does not support yet")


def out_of_scope(name: str) -> Callable[..., NoReturn]:
    """What importing the :data:`OUT_OF_SCOPE` name ``name`` gives: a function that raises
    :class:`~fedcore.errors.UsageError` saying why, when called.

    The import itself succeeds, with that line logged once: Flower's e2e apps import
    ``start_client`` beside ``NumPyClient`` and call it only when run as a script.
    """
    line = f"{name} {OUT_OF_SCOPE[name]}"
    _flower_log.warning("%s", line)

    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise UsageError(line)

    refused.__name__ = refused.__qualname__ = name.rpartition(".")[2]
    refused.__module__ = name.rpartition(".")[0]
    return refused


class _FlowerFinder(importlib.abc.MetaPathFinder):
    """Finds ``flwr`` and its modules in :data:`FLOWER_NAMES`; refuses the others."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "flwr" and not fullname.startswith("flwr."):
            return None
        if fullname not in FLOWER_NAMES:
            raise unsupported(fullname)
        return importlib.util.spec_from_loader(fullname, _LOADER, is_package=True)


class _FlowerLoader(importlib.abc.Loader):
    """Fills a shim module: its ``__all__`` and a ``__getattr__`` that resolves names."""

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        names = FLOWER_NAMES[name]
        prefix = f"{name}."
        children = sorted(
            key.removeprefix(prefix)
            for key in FLOWER_NAMES
            if key.startswith(prefix) and "." not in key.removeprefix(prefix)
        )
        module.__doc__ = f"fedcore's stand-in for Flower's {name}; see {__name__}."
        setattr(module, "__all__", sorted(names))  # noqa: B010
        setattr(module, _MARK, True)

        def __getattr__(attr: str) -> object:
            if attr.startswith("_") and attr not in names:  # probes expect AttributeError
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            if attr in children:
                return importlib.import_module(f"{prefix}{attr}")
            if f"{prefix}{attr}" in OUT_OF_SCOPE:
                value: object = out_of_scope(f"{prefix}{attr}")
            elif attr not in names:
                raise unsupported(f"{prefix}{attr}")
            else:
                value = _resolve(names[attr], f"{prefix}{attr}")
            setattr(module, attr, value)  # the next lookup is an ordinary one
            return value

        def __dir__() -> list[str]:
            return sorted({*vars(module), *names, *children})

        setattr(module, "__getattr__", __getattr__)  # noqa: B010 (a module's hook, by name)
        setattr(module, "__dir__", __dir__)  # noqa: B010


_LOADER = _FlowerLoader()


def _resolve(target: str, flower_name: str) -> object:
    """The object at ``target`` (``module:attr``), or the error for ``flower_name`` if
    fedcore has no such module or attribute (yet)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(f"{missing}.")):
            raise unsupported(flower_name) from None
        raise
    try:
        return getattr(module, attr)
    except AttributeError:
        raise unsupported(flower_name) from None
