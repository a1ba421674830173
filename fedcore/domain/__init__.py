"""The domain: records, messages, contexts and lifecycles. Standard library and numpy only.

Each name is imported from its module on first use: a run's status or a log line
(``fedcore ls``, ``fedcore log``) needs no numpy, which only records bring in.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.domain.array import Array, NDArray, NDArrays
    from fedcore.domain.context import Context, UserConfig, UserConfigValue
    from fedcore.domain.lifecycle import MessageStatus, RunStatus, transition
    from fedcore.domain.message import (
        DEFAULT_TTL,
        SERVER_NODE_ID,
        Error,
        ErrorCode,
        Message,
        MessageType,
        Metadata,
    )
    from fedcore.domain.records import ArrayRecord, ConfigRecord, MetricRecord, Record, RecordDict
    from fedcore.domain.run import LogLine, MetricsLine, Run

__all__ = [
    "DEFAULT_TTL",
    "SERVER_NODE_ID",
    "Array",
    "ArrayRecord",
    "ConfigRecord",
    "Context",
    "Error",
    "ErrorCode",
    "LogLine",
    "Message",
    "MessageStatus",
    "MessageType",
    "Metadata",
    "MetricRecord",
    "MetricsLine",
    "NDArray",
    "NDArrays",
    "Record",
    "RecordDict",
    "Run",
    "RunStatus",
    "UserConfig",
    "UserConfigValue",
    "transition",
]

_MODULES = {
    "context": ("Context", "UserConfig", "UserConfigValue"),
    "lifecycle": ("MessageStatus", "RunStatus", "transition"),
    "message": (
        "DEFAULT_TTL",
        "SERVER_NODE_ID",
        "Error",
        "ErrorCode",
        "Message",
        "MessageType",
        "Metadata",
    ),
    "array": ("Array", "NDArray", "NDArrays"),
    "records": ("ArrayRecord", "ConfigRecord", "MetricRecord", "Record", "RecordDict"),
    "run": ("LogLine", "MetricsLine", "Run"),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
