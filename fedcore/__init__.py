"""fedcore: an asyncio-native federated-learning orchestrator.

The author-facing API: records, messages, contexts, the two apps and the Grid
between them, and the simulation entry points. Everything else lives in
subpackages (``fedcore.strategy``, ``fedcore.data``, ...).
"""

from fedcore.apps import App, ClientApp, Grid, ServerApp, SyncGrid
from fedcore.domain import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    ErrorCode,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from fedcore.simulation import Resources, SimulationResult, run_simulation, simulate

__version__ = "0.1.0"

__all__ = [
    "App",
    "ArrayRecord",
    "ClientApp",
    "ConfigRecord",
    "Context",
    "Error",
    "ErrorCode",
    "Grid",
    "Message",
    "Metadata",
    "MetricRecord",
    "RecordDict",
    "Resources",
    "ServerApp",
    "SimulationResult",
    "SyncGrid",
    "run_simulation",
    "simulate",
]
