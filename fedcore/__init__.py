"""fedcore: an asyncio-native federated-learning orchestrator.

The author-facing API: records, messages, contexts, the two apps and the Grid
between them, and the simulation entry points. Everything else lives in
subpackages (``fedcore.strategy``, ``fedcore.data``, ...).

Each name is imported from its home on first use (``fc.ClientApp``, or
``from fedcore import ClientApp``), not by ``import fedcore`` itself: every
``fedcore`` command and every simulation worker imports this package, and most
of them need neither numpy nor the simulation engine to start.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.apps import App, ClientApp, Grid, ServerApp, SyncGrid
    from fedcore.domain import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Context,
        Error,
        ErrorCode,
        Message,
        MessageType,
        Metadata,
        MetricRecord,
        NDArray,
        NDArrays,
        RecordDict,
        UserConfig,
        UserConfigValue,
    )
    from fedcore.simulation import Resources, SimulationResult
    from fedcore.simulation.simulate import run_simulation, simulate

__version__ = "0.1.0"

__all__ = [
    "App",
    "Array",
    "ArrayRecord",
    "ClientApp",
    "ConfigRecord",
    "Context",
    "Error",
    "ErrorCode",
    "Grid",
    "Message",
    "MessageType",
    "Metadata",
    "MetricRecord",
    "NDArray",
    "NDArrays",
    "RecordDict",
    "Resources",
    "ServerApp",
    "SimulationResult",
    "SyncGrid",
    "UserConfig",
    "UserConfigValue",
    "run_simulation",
    "simulate",
]

_HOMES = {
    **dict.fromkeys(("App", "ClientApp", "Grid", "ServerApp", "SyncGrid"), "apps"),
    **dict.fromkeys(
        (
            "Array",
            "ArrayRecord",
            "ConfigRecord",
            "Context",
            "Error",
            "ErrorCode",
            "Message",
            "MessageType",
            "Metadata",
            "MetricRecord",
            "NDArray",
            "NDArrays",
            "RecordDict",
            "UserConfig",
            "UserConfigValue",
        ),
        "domain",
    ),
    **dict.fromkeys(("Resources", "SimulationResult"), "simulation"),
    **dict.fromkeys(("run_simulation", "simulate"), "simulation.simulate"),
}


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
