"""Flower's legacy API names (``NumPyClient``, ``flwr.server.strategy``, …) for the ``flwr`` shim.

The part of :data:`fedcore.apps.flower_imports.FLOWER_NAMES` that :mod:`fedcore.legacy`
serves, kept apart because it is most of the table: each ``flwr`` module, its legacy
names and the ``module:attr`` of each. Strings only: nothing here imports the legacy
layer, which loads when an app first uses one of its names.
"""

from __future__ import annotations

from collections.abc import Sequence


def _in(module: str, names: Sequence[str]) -> dict[str, str]:
    return {name: f"{module}:{name}" for name in names}


# ---- the legacy client side: NumPyClient, Client, client_fn, the Ins/Res types
_LEGACY_TYPES = _in(
    "fedcore.legacy.types",
    (
        "Code",
        "Config",
        "DisconnectRes",
        "EvaluateIns",
        "EvaluateRes",
        "FitIns",
        "FitRes",
        "GetParametersIns",
        "GetParametersRes",
        "GetPropertiesIns",
        "GetPropertiesRes",
        "Metrics",
        "MetricsAggregationFn",
        "Parameters",
        "Properties",
        "ReconnectIns",
        "Scalar",
        "Status",
    ),
)
_LEGACY_ARRAY_TYPES = {
    "NDArray": "fedcore.domain.array:NDArray",
    "NDArrays": "fedcore.domain.array:NDArrays",
    **_in("fedcore.legacy.numpy_client", ("NDArrayFloat", "NDArrayInt")),
    "Value": "fedcore.legacy.conversion:Value",
}
_LEGACY_PARAMETER = _in(
    "fedcore.legacy.types",
    ("bytes_to_ndarray", "ndarray_to_bytes", "ndarrays_to_parameters", "parameters_to_ndarrays"),
)
_LEGACY_CLIENT_FNS = _in("fedcore.legacy.client", ("ClientFn", "ClientFnExt"))
_LEGACY_CLIENT_CHECKS = ("has_evaluate", "has_fit", "has_get_parameters", "has_get_properties")
_LEGACY_CLIENT_APP = {"ClientApp": "fedcore.legacy.client_app:ClientApp"}
_LEGACY_CLIENT: dict[str, dict[str, str]] = {
    "flwr.client": {
        **_in("fedcore.legacy.client", ("Client",)),
        **_in("fedcore.legacy.numpy_client", ("NumPyClient",)),
        **_LEGACY_CLIENT_FNS,
        **_LEGACY_CLIENT_APP,
    },
    "flwr.client.client": _in(
        "fedcore.legacy.client",
        (
            "Client",
            *_LEGACY_CLIENT_CHECKS,
            "maybe_call_evaluate",
            "maybe_call_fit",
            "maybe_call_get_parameters",
            "maybe_call_get_properties",
        ),
    ),
    "flwr.client.numpy_client": _in(
        "fedcore.legacy.numpy_client", ("NumPyClient", *_LEGACY_CLIENT_CHECKS)
    ),
    "flwr.client.typing": _LEGACY_CLIENT_FNS,
    "flwr.clientapp": _LEGACY_CLIENT_APP,
    "flwr.common": {
        **_LEGACY_TYPES,
        **_LEGACY_ARRAY_TYPES,
        **_LEGACY_PARAMETER,
        "MessageTypeLegacy": "fedcore.legacy.conversion:MessageTypeLegacy",
    },
    "flwr.common.typing": {**_LEGACY_TYPES, **_LEGACY_ARRAY_TYPES},
    "flwr.common.parameter": _LEGACY_PARAMETER,
    "flwr.common.recorddict_compat": _in(
        "fedcore.legacy.conversion",
        (
            "EMPTY_TENSOR_KEY",
            "arrayrecord_to_parameters",
            "evaluateins_to_recorddict",
            "evaluateres_to_recorddict",
            "fitins_to_recorddict",
            "fitres_to_recorddict",
            "getparametersins_to_recorddict",
            "getparametersres_to_recorddict",
            "getpropertiesins_to_recorddict",
            "getpropertiesres_to_recorddict",
            "parameters_to_arrayrecord",
            "recorddict_to_evaluateins",
            "recorddict_to_evaluateres",
            "recorddict_to_fitins",
            "recorddict_to_fitres",
            "recorddict_to_getparametersins",
            "recorddict_to_getparametersres",
            "recorddict_to_getpropertiesins",
            "recorddict_to_getpropertiesres",
        ),
    ),
}
"""The legacy client side's names; ``ClientApp`` is the legacy-capable subclass."""


# ---- Flower's legacy strategies, ClientManager, ClientProxy and Criterion
_LEGACY_STRATEGY_MODULES = {
    "bulyan": ("Bulyan",),
    "dp_adaptive_clipping": (
        "DifferentialPrivacyClientSideAdaptiveClipping",
        "DifferentialPrivacyServerSideAdaptiveClipping",
    ),
    "dp_fixed_clipping": (
        "DifferentialPrivacyClientSideFixedClipping",
        "DifferentialPrivacyServerSideFixedClipping",
    ),
    "dpfedavg_adaptive": ("DPFedAvgAdaptive",),
    "dpfedavg_fixed": ("DPFedAvgFixed",),
    "fault_tolerant_fedavg": ("FaultTolerantFedAvg",),
    "fedadagrad": ("FedAdagrad",),
    "fedadam": ("FedAdam",),
    "fedavg": ("FedAvg",),
    "fedavg_android": ("FedAvgAndroid",),
    "fedavgm": ("FedAvgM",),
    "fedmedian": ("FedMedian",),
    "fedopt": ("FedOpt",),
    "fedprox": ("FedProx",),
    "fedtrimmedavg": ("FedTrimmedAvg",),
    "fedxgb_bagging": ("FedXgbBagging",),
    "fedxgb_cyclic": ("FedXgbCyclic",),
    "fedxgb_nn_avg": ("FedXgbNnAvg",),
    "fedyogi": ("FedYogi",),
    "krum": ("Krum",),
    "qfedavg": ("QFedAvg",),
    "strategy": ("Strategy",),
}
"""Flower's ``flwr.server.strategy`` submodules and the strategies each defines."""
_LEGACY_AGGREGATE = (
    "aggregate",
    "aggregate_bulyan",
    "aggregate_inplace",
    "aggregate_krum",
    "aggregate_median",
    "aggregate_qffl",
    "aggregate_trimmed_avg",
    "weighted_loss_avg",
    # Private, but imported by Flower's own tests of them.
    "_aggregate_n_closest_weights",
    "_check_weights_equality",
    "_compute_distances",
    "_find_reference_weights",
    "_trim_mean",
)
_LEGACY_CLIENT_MANAGER = {
    name: f"fedcore.legacy.client_manager:{name}"
    for name in ("ClientManager", "SimpleClientManager")
}
_LEGACY_STRATEGIES: dict[str, dict[str, str]] = {
    "flwr.server": _LEGACY_CLIENT_MANAGER,
    "flwr.server.client_manager": _LEGACY_CLIENT_MANAGER,
    "flwr.server.client_proxy": {"ClientProxy": "fedcore.legacy.client_proxy:ClientProxy"},
    "flwr.server.criterion": {"Criterion": "fedcore.legacy.client_manager:Criterion"},
    "flwr.server.strategy": {
        name: f"fedcore.legacy.strategy:{name}"
        for names in _LEGACY_STRATEGY_MODULES.values()
        for name in names
    },
    "flwr.server.strategy.aggregate": {
        name: f"fedcore.legacy.strategy.aggregate:{name}" for name in _LEGACY_AGGREGATE
    },
    **{
        f"flwr.server.strategy.{module}": {
            name: f"fedcore.legacy.strategy:{name}" for name in names
        }
        for module, names in _LEGACY_STRATEGY_MODULES.items()
    },
}
"""The legacy strategies, ClientManager, ClientProxy and Criterion."""

# ---- the legacy server: Server, History, ServerApp(server_fn=...), workflows
_SERVER = "fedcore.legacy.server"
_SERVER_APP = "fedcore.legacy.server_app"
_SERVER_CONFIG = {
    "ServerAppComponents": "fedcore.legacy.server_config:ServerAppComponents",
    "ServerConfig": "fedcore.legacy.server_config:ServerConfig",
}
_HISTORY = {"History": "fedcore.legacy.history:History"}
_LEGACY_CONTEXT = {"LegacyContext": "fedcore.legacy.workflow:LegacyContext"}
_LEGACY_SERVER_APP = {"ServerApp": f"{_SERVER_APP}:ServerApp"}
_WORKFLOWS = {
    name: f"fedcore.legacy.workflow:{name}"
    for name in (
        "DefaultWorkflow",
        "default_centralized_evaluation_workflow",
        "default_evaluate_workflow",
        "default_fit_workflow",
        "default_init_params_workflow",
    )
}
_LEGACY_SERVER: dict[str, dict[str, str]] = {
    "flwr.server": {
        **_SERVER_CONFIG,
        **_HISTORY,
        **_LEGACY_CONTEXT,
        **_LEGACY_SERVER_APP,
        "Server": f"{_SERVER}:Server",
        "Driver": "fedcore:Grid",  # Flower's deprecated name of Grid
    },
    "flwr.serverapp": _LEGACY_SERVER_APP,
    "flwr.server.server_app": _LEGACY_SERVER_APP,
    "flwr.server.server": {
        name: f"{_SERVER}:{name}"
        for name in (
            "EvaluateResultsAndFailures",
            "FitResultsAndFailures",
            "ReconnectResultsAndFailures",
            "Server",
            "evaluate_clients",
            "fit_clients",
            "init_defaults",
            "reconnect_clients",
            "run_fl",
        )
    },
    "flwr.server.history": _HISTORY,
    "flwr.server.server_config": {"ServerConfig": _SERVER_CONFIG["ServerConfig"]},
    "flwr.server.serverapp_components": {
        "ServerAppComponents": _SERVER_CONFIG["ServerAppComponents"]
    },
    "flwr.server.compat": {**_LEGACY_CONTEXT, "start_grid": f"{_SERVER_APP}:start_grid"},
    "flwr.server.compat.app": {"start_grid": f"{_SERVER_APP}:start_grid"},
    "flwr.server.compat.app_utils": {
        "start_update_client_manager_thread": (
            "fedcore.legacy.grid_client_proxy:start_update_client_manager_thread"
        )
    },
    "flwr.server.compat.grid_client_proxy": {
        "GridClientProxy": "fedcore.legacy.grid_client_proxy:GridClientProxy"
    },
    "flwr.server.compat.legacy_context": _LEGACY_CONTEXT,
    "flwr.server.workflow": {"DefaultWorkflow": _WORKFLOWS["DefaultWorkflow"]},
    "flwr.server.workflow.constant": _in(
        "fedcore.legacy.workflow", ("MAIN_CONFIGS_RECORD", "MAIN_PARAMS_RECORD")
    ),
    "flwr.server.workflow.default_workflows": _WORKFLOWS,
}
"""The legacy server: Server, History, ServerApp(server_fn=...), LegacyContext, workflows."""

# ---- legacy scripts: start_simulation and run_simulation on fedcore's engine
_LEGACY_SCRIPTS: dict[str, dict[str, str]] = {
    "flwr.simulation": _in("fedcore.legacy.simulation", ("run_simulation", "start_simulation")),
}

# ---- what Flower's baselines import besides (tests/legacy/test_flower_baselines.py)
_BASELINES: dict[str, dict[str, str]] = {
    # Flower's flwr/common/typing.py imports these from typing, and baselines written for
    # older Pythons import them from there (niid_bench: Dict, List, Optional, Tuple, Union).
    "flwr.common.typing": _in(
        "typing", ("Any", "Callable", "Dict", "List", "Optional", "Tuple", "Union")
    ),
}
"""The names Flower's baselines import that no other part serves."""

LEGACY_NAMES: dict[str, dict[str, str]] = {}
"""Each ``flwr`` module -> its legacy names -> the fedcore ``module:attr`` behind each."""
for _part in (_LEGACY_CLIENT, _LEGACY_STRATEGIES, _LEGACY_SERVER, _LEGACY_SCRIPTS, _BASELINES):
    for _module, _names in _part.items():
        LEGACY_NAMES.setdefault(_module, {}).update(_names)
