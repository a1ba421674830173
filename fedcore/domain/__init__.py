"""The domain: records, messages, contexts and lifecycles. Standard library and numpy only."""

from fedcore.domain.context import Context
from fedcore.domain.lifecycle import MessageStatus, RunStatus, transition
from fedcore.domain.message import (
    DEFAULT_TTL,
    SERVER_NODE_ID,
    Error,
    ErrorCode,
    Message,
    Metadata,
)
from fedcore.domain.records import (
    ArrayRecord,
    ConfigRecord,
    MetricRecord,
    Record,
    RecordDict,
)
from fedcore.domain.run import LogLine, Run

__all__ = [
    "DEFAULT_TTL",
    "SERVER_NODE_ID",
    "ArrayRecord",
    "ConfigRecord",
    "Context",
    "Error",
    "ErrorCode",
    "LogLine",
    "Message",
    "MessageStatus",
    "Metadata",
    "MetricRecord",
    "Record",
    "RecordDict",
    "Run",
    "RunStatus",
    "transition",
]
