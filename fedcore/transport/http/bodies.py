"""What the HTTP APIs' bodies hold: JSON documents of domain objects, read under a cap.

Records never travel as JSON (they are fedcore.wire payloads); what does is small:
runs, log lines, metrics lines, nodes, health, run configs, lists of ids. Run and node ids are
63-bit, so they travel as decimal strings: JavaScript, and many JSON tools, hold
numbers as doubles, exact only up to 2^53. A run's seed is such a number too.

Decoding is strict: a document that is not exactly what its reader expects raises
:class:`~fedcore.errors.DecodeError`, never ``KeyError`` or ``TypeError``, so that
garbage from a peer is refused as garbage. Fields a reader does not know are
ignored, so that a newer peer may add some.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import aiohttp

from fedcore.domain import LogLine, MetricsLine, Run, RunStatus
from fedcore.errors import DecodeError
from fedcore.transport.control import Health, NodeInfo
from fedcore.wire.frame import MAX_DETAIL, Buffer
from fedcore.wire.spool import SPOOL_THRESHOLD, Spool

if TYPE_CHECKING:  # a type only: the fleet codec (betterproto) stays out of `fedcore ls`
    from fedcore.domain import UserConfigValue

MAX_JSON_BYTES = 16 * 2**20
"""The largest JSON body either side reads (also the longest line of a log stream)."""
JSON = "application/json"
RECORDDICT = "application/vnd.fedcore.recorddict"
"""The content type of a body that is one RecordDict (fedcore.wire): a context, an artifact."""
MAX_PAYLOAD_BYTES = 1 << 30
"""The largest payload body (a batch of messages, a context, an artifact) either side reads."""
MAX_ID = 2**63 - 1
_INT64 = range(-(2**63), 2**63)
_ID = re.compile(r"0|[1-9][0-9]{0,18}")
_SIGNED = re.compile(r"-?(0|[1-9][0-9]{0,18})")
_READ_SIZE = 4 << 20
WRITE_SLICE = 256 * 1024
"""Bytes of a large body written at a time, either side, so the event loop runs between slices."""


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body in ``content``, or its first ``limit + 1`` bytes if it is longer.

    The caller refuses a result longer than ``limit``: no more than that is ever
    buffered, whatever the peer sends or claims to send.
    """
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await content.read(min(_READ_SIZE, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def read_payload(content: aiohttp.StreamReader, limit: int) -> Buffer:
    """A payload body (a message batch, a RecordDict), or its first ``limit + 1`` bytes.

    As :func:`read_at_most`, except that a body past :data:`SPOOL_THRESHOLD` goes to a
    :class:`~fedcore.wire.spool.Spool` and comes back mapped: a 200 MB model costs
    the reader a read buffer of memory, not 200 MB (see :mod:`fedcore.wire.spool`).
    """
    pieces: list[bytes] = []
    size = 0
    with contextlib.ExitStack() as spooling:
        spool: Spool | None = None
        while size <= limit:
            piece = await content.read(min(_READ_SIZE, limit + 1 - size))
            if not piece:
                break
            size += len(piece)
            if spool is None and size > SPOOL_THRESHOLD:
                spool = spooling.enter_context(Spool())
                spool.write_all(pieces)
                pieces.clear()
            if spool is None:
                pieces.append(piece)
            else:
                spool.write(piece)
        return b"".join(pieces) if spool is None else spool.mapped()


def dumps(document: object) -> bytes:
    """``document`` as compact UTF-8 JSON."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def loads(data: bytes | bytearray) -> Any:
    """The JSON document in ``data``; DecodeError for anything that is not one."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        invalid(f"not a JSON document: {exc}", exc)


def invalid(problem: str, cause: BaseException | None = None) -> NoReturn:
    """Refuse a document, in one line of a few hundred characters at most."""
    raise DecodeError(f"invalid document: {one_line(problem)}") from cause


def one_line(message: str) -> str:
    """``message`` on one line of a few hundred characters at most."""
    message = " ".join(message.split())
    return message if len(message) <= MAX_DETAIL else message[: MAX_DETAIL - 3] + "..."


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        invalid("an object repeats a key")
    return document


# Fields ----------------------------------------------------------------------------


def fields(document: object, what: str) -> dict[str, Any]:
    """``document`` if it is a JSON object."""
    if not isinstance(document, dict):
        invalid(f"{what} must be an object, got {_kind(document)}")
    return document


def text(document: Mapping[str, Any], name: str) -> str:
    value = document.get(name)
    if type(value) is not str:
        invalid(f"{name!r} must be a string, got {_kind(value)}")
    return value


def flag(document: Mapping[str, Any], name: str) -> bool:
    value = document.get(name)
    if type(value) is not bool:
        invalid(f"{name!r} must be true or false, got {_kind(value)}")
    return value


def count(document: Mapping[str, Any], name: str) -> int:
    """A non-negative int small enough to be exact in any JSON reader."""
    value = document.get(name)
    if type(value) is not int or not 0 <= value <= 2**53:
        invalid(f"{name!r} must be an integer from 0 to 2^53, got {_kind(value)}")
    return value


def number(document: Mapping[str, Any], name: str) -> float:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        invalid(f"{name!r} must be a number, got {_kind(value)}")
    return float(value)


def seconds(document: Mapping[str, Any], name: str) -> float:
    """A duration: a finite, non-negative number."""
    value = number(document, name)
    if not 0 <= value < math.inf:
        invalid(f"{name!r} must be a finite number of seconds, not negative, got {value!r}")
    return value


def texts(document: Mapping[str, Any], name: str) -> list[str]:
    value = document.get(name)
    if not isinstance(value, list) or not all(type(item) is str for item in value):
        invalid(f"{name!r} must be a list of strings")
    return value


def texts_or_null(document: Mapping[str, Any], name: str) -> list[str] | None:
    """A list of strings, or ``None`` where the document holds ``null`` (not where it
    lacks the key: a field left out is a mistake, a ``null`` a choice)."""
    if name in document and document[name] is None:
        return None
    return texts(document, name)


# Ids -------------------------------------------------------------------------------


def id_to_json(value: int) -> str:
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise ValueError(f"an id must be an int from 0 to 2^63-1, got {value!r}")
    return str(value)


def id_from_json(value: object, what: str) -> int:
    """A 63-bit id from its decimal string."""
    if type(value) is not str or not _ID.fullmatch(value) or int(value) > MAX_ID:
        invalid(f"{what} must be a decimal string of an int from 0 to 2^63-1, got {value!r}")
    return int(value)


def ids_from_json(document: Mapping[str, Any], name: str) -> list[int]:
    values = document.get(name)
    if not isinstance(values, list):
        invalid(f"{name!r} must be a list of id strings")
    return [id_from_json(value, f"an id in {name!r}") for value in values]


# Run configs -----------------------------------------------------------------------


def config_to_json(config: Mapping[str, Any]) -> dict[str, UserConfigValue]:
    """A run config as an object: bool, int (64-bit), float and str values only."""
    document: dict[str, UserConfigValue] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | float | str):
            raise TypeError(
                f"run config {key!r} has a {type(value).__name__}; "
                "values must be bool, int, float or str"
            )
        if type(value) is int and value not in _INT64:
            raise ValueError(f"run config {key!r} = {value} does not fit in 64 bits")
        document[key] = value
    return document


def config_from_json(document: object) -> dict[str, UserConfigValue]:
    config: dict[str, UserConfigValue] = {}
    for key, value in fields(document, "a run config").items():
        if type(value) not in (bool, int, float, str):
            invalid(f"run config {key!r} must be a bool, number or string, got {_kind(value)}")
        if type(value) is int and value not in _INT64:
            invalid(f"run config {key!r} does not fit in 64 bits")
        config[key] = value
    return config


# Runs, log lines, nodes, health ----------------------------------------------------


def run_to_json(run: Run) -> dict[str, Any]:
    return {
        "run_id": id_to_json(run.run_id),
        "status": run.status.value,
        "reason": run.reason,
        "run_config": config_to_json(run.run_config),
        "seed": None if run.seed is None else str(run.seed),
        "bundle_hash": run.bundle_hash,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
    }


def run_from_json(document: object) -> Run:
    doc = fields(document, "a run")
    try:
        status = RunStatus(text(doc, "status"))
    except ValueError as exc:
        invalid(f"unknown run status {doc['status']!r}", exc)
    seed = doc.get("seed")
    if seed is not None and (type(seed) is not str or not _SIGNED.fullmatch(seed)):
        invalid(f"'seed' must be null or a decimal string, got {_kind(seed)}")
    if seed is not None and int(seed) not in _INT64:
        invalid("'seed' does not fit in 64 bits")
    finished_at = None if doc.get("finished_at") is None else number(doc, "finished_at")
    return Run(
        run_id=id_from_json(doc.get("run_id"), "'run_id'"),
        run_config=config_from_json(doc.get("run_config")),
        status=status,
        reason=text(doc, "reason"),
        seed=None if seed is None else int(seed),
        bundle_hash=text(doc, "bundle_hash"),
        created_at=number(doc, "created_at"),
        finished_at=finished_at,
    )


def runs_from_json(document: object) -> list[Run]:
    runs = fields(document, "a list of runs").get("runs")
    if not isinstance(runs, list):
        invalid("'runs' must be a list")
    return [run_from_json(run) for run in runs]


def log_line_to_json(line: LogLine) -> dict[str, Any]:
    return {"seq": line.seq, "time": line.time, "text": line.text}


def log_line_from_json(document: object) -> LogLine:
    doc = fields(document, "a log line")
    return LogLine(count(doc, "seq"), number(doc, "time"), text(doc, "text"))


def metrics_line_to_json(line: MetricsLine) -> dict[str, Any]:
    return {"seq": line.seq, "document": line.document}


def metrics_line_from_json(document: object) -> MetricsLine:
    doc = fields(document, "a metrics line")
    return MetricsLine(count(doc, "seq"), metrics_document(doc.get("document")))


def metrics_document(document: object) -> dict[str, Any]:
    """A metrics line's document: any JSON object (the ServerApp's header or a round)."""
    return fields(document, "a metrics document")


def node_to_json(node: NodeInfo) -> dict[str, Any]:
    return {"node_id": id_to_json(node.node_id), "online": node.online}


def nodes_from_json(document: object) -> list[NodeInfo]:
    nodes = fields(document, "a list of nodes").get("nodes")
    if not isinstance(nodes, list):
        invalid("'nodes' must be a list")
    infos = []
    for node in nodes:
        doc = fields(node, "a node")
        infos.append(NodeInfo(id_from_json(doc.get("node_id"), "'node_id'"), flag(doc, "online")))
    return infos


def health_to_json(health: Health) -> dict[str, Any]:
    return {
        "version": health.version,
        "runs_active": health.runs_active,
        "nodes_online": health.nodes_online,
    }


def health_from_json(document: object) -> Health:
    doc = fields(document, "a health report")
    return Health(text(doc, "version"), count(doc, "runs_active"), count(doc, "nodes_online"))


def _kind(value: object) -> str:
    """What a JSON value is, in JSON's words, for error messages that quote no data."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
