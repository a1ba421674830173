"""The fleet wire: domain objects to and from the fleet API's protobuf messages.

Protobuf carries the envelope only (``protos/fedcore/v1/*.proto``): a message's
metadata are protobuf fields, its records travel as ``bytes`` in fedcore's own
RecordDict encoding (:mod:`fedcore.wire.records`). This module, with
:mod:`fedcore.wire.protobuf` (untrusted bytes in), :mod:`fedcore.wire.chunks`
(payloads over the frame cap) and :mod:`fedcore.wire.rpc` (each RPC's frames as
bytes), is the door to the generated code in ``fedcore.wire._pb``; the rest of
fedcore sees domain objects, the fleet's among them (:mod:`fedcore.domain.fleet`).

Decoding checks every field and raises :class:`~fedcore.errors.DecodeError` for
anything invalid. Encoding raises ``TypeError``/``ValueError`` for what the wire
cannot carry (a negative id, an int past 64 bits), so a bad message fails at its
sender. Content whose encoding is over :data:`MAX_INLINE_CONTENT` travels as a
payload in chunks, referenced from the message by a
:class:`~fedcore.domain.fleet.PayloadRef`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import betterproto

from fedcore.domain import Error, Message, Run, RunStatus, UserConfigValue
from fedcore.domain.fleet import Digest, PayloadRef, PushedReply
from fedcore.domain.message import assemble_message
from fedcore.errors import (
    ConflictError,
    DecodeError,
    FedcoreError,
    MessageNotFoundError,
    NodeNotFoundError,
    ReplyRejectedError,
    RunFinishedError,
)
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.chunks import digest_of_fields
from fedcore.wire.frame import DEFAULT_LIMITS, MAX_DETAIL, Buffer, DecodeLimits, parts_size
from fedcore.wire.message import METADATA_FIELDS, decode_metadata, encode_metadata
from fedcore.wire.protobuf import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    decoded_int,
    int_in,
    invalid,
    seconds,
)
from fedcore.wire.records import pack_recorddict_parts, unpack_recorddict

MAX_INLINE_CONTENT = 64 * 1024
"""Content encoded to more bytes than this travels as a payload, not inline.

Small, because inline content goes through protobuf messages nested three deep,
and each level of betterproto's encoding copies it (about 7 ms per MB each way,
measured); a payload's chunks are copied once into their frame. Below this size a
payload's extra round trip would cost more than the copies save."""


# Messages ------------------------------------------------------------------------


def message_to_pb(msg: Message, *, payload: PayloadRef | None = None) -> pb.Message:
    """The protobuf of ``msg``: its content inline, or ``payload`` when given.

    Content over :data:`MAX_INLINE_CONTENT` bytes must travel as a payload: encode it
    with :func:`fedcore.wire.pack_recorddict_parts`, send its :func:`iter_chunks`,
    and pass the resulting reference here. Raises ``ValueError`` otherwise.
    """
    metadata = pb.Metadata(**_metadata_fields(msg))
    if msg.has_error():
        if payload is not None:
            raise ValueError("an error reply has no content to put in a payload")
        code = int_in("error code", msg.error.code, INT64_MIN, INT64_MAX)
        return pb.Message(metadata=metadata, error=pb.Error(code=code, reason=msg.error.reason))
    if payload is not None:
        ref = pb.PayloadRef(
            payload_id=payload.payload_id, size=payload.digest.size, sha256=payload.digest.sha256
        )
        return pb.Message(metadata=metadata, payload=ref)
    parts = pack_recorddict_parts(msg.content)
    size = parts_size(parts)
    if size > MAX_INLINE_CONTENT:
        raise ValueError(
            f"content of {size} bytes is over the inline limit of {MAX_INLINE_CONTENT}; "
            "send it in chunks and pass payload="
        )
    return pb.Message(metadata=metadata, content=b"".join(parts))


def _metadata_fields(msg: Message) -> dict[str, Any]:
    values = encode_metadata(msg.metadata)
    fields = {name: value for (name, _), value in zip(METADATA_FIELDS, values, strict=True)}
    for name, value in fields.items():
        if isinstance(value, int):
            int_in(f"message {name}", value, 0, UINT64_MAX)
    return fields


def payload_ref(message: pb.Message) -> PayloadRef | None:
    """The payload ``message``'s content must be fetched from, or None if it has none."""
    kind, ref = betterproto.which_one_of(message, "body")
    if kind != "payload":
        return None
    if not isinstance(ref, pb.PayloadRef) or not ref.payload_id:
        invalid("a payload reference needs a payload id")
    return PayloadRef(ref.payload_id, digest_of_fields(ref.size, ref.sha256, "payload reference"))


def message_from_pb(
    message: pb.Message,
    *,
    payload: Buffer | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> Message:
    """Rebuild the Message that ``message`` carries, checking every field.

    A message whose content is a payload needs that payload as ``payload``, as
    :class:`PayloadBuffer` returns it (verified against :func:`payload_ref`). Arrays
    in the content are read-only views into the content bytes or ``payload``.
    """
    if not betterproto.serialized_on_wire(message.metadata):
        invalid("a message needs metadata")
    fields = [getattr(message.metadata, name) for name, _ in METADATA_FIELDS]
    metadata = decode_metadata(fields)
    kind, _ = betterproto.which_one_of(message, "body")
    ref = payload_ref(message)
    if payload is not None and ref is None:
        raise ValueError("payload= was given, but this message carries no payload reference")
    if kind == "error":
        if not metadata.reply_to_message_id:
            invalid("only a reply can carry an error")
        error = message.error
        code = decoded_int("error code", error.code, INT64_MIN, INT64_MAX)
        return assemble_message(metadata, error=Error(code, error.reason))
    if kind == "content":
        if len(message.content) > MAX_INLINE_CONTENT:
            invalid(f"inline content of {len(message.content)} bytes is over {MAX_INLINE_CONTENT}")
        return assemble_message(metadata, content=unpack_recorddict(message.content, limits))
    if ref is None:
        invalid("a message needs content, a payload or an error")
    if payload is None:
        raise ValueError(f"this message's content is payload {ref.payload_id!r}: pass payload=")
    if len(payload) != ref.digest.size:
        raise ValueError(f"payload= has {len(payload)} bytes, its reference {ref.digest.size}")
    return assemble_message(metadata, content=unpack_recorddict(payload, limits))


# Configs, runs and nodes -----------------------------------------------------------

_RUN_STATUSES: dict[RunStatus, int] = {
    RunStatus.PENDING: pb.RunStatus.PENDING,
    RunStatus.STARTING: pb.RunStatus.STARTING,
    RunStatus.RUNNING: pb.RunStatus.RUNNING,
    RunStatus.COMPLETED: pb.RunStatus.FINISHED_COMPLETED,
    RunStatus.FAILED: pb.RunStatus.FINISHED_FAILED,
    RunStatus.STOPPED: pb.RunStatus.FINISHED_STOPPED,
}
_PB_RUN_STATUSES = {value: key for key, value in _RUN_STATUSES.items()}


def config_to_pb(config: Mapping[str, object]) -> list[pb.ConfigEntry]:
    """A run or node config as entries, in order. Values are bool, int, float or str."""
    entries = []
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"config keys must be str, got {type(key).__name__}")
        if isinstance(value, bool):
            entries.append(pb.ConfigEntry(key=key, bool_value=value))
        elif isinstance(value, int):
            value = int_in(f"config key {key!r}", value, INT64_MIN, INT64_MAX)
            entries.append(pb.ConfigEntry(key=key, int_value=value))
        elif isinstance(value, float):
            entries.append(pb.ConfigEntry(key=key, float_value=float(value)))
        elif isinstance(value, str):
            entries.append(pb.ConfigEntry(key=key, string_value=str(value)))
        else:
            raise TypeError(
                f"config key {key!r} has a {type(value).__name__}; "
                "values must be bool, int, float or str"
            )
    return entries


def config_from_pb(entries: Sequence[pb.ConfigEntry]) -> dict[str, UserConfigValue]:
    """The config that ``entries`` carry; keys must be unique and each have a value."""
    config: dict[str, UserConfigValue] = {}
    for entry in entries:
        if entry.key in config:
            invalid(f"duplicate config key {entry.key!r}")
        kind, value = betterproto.which_one_of(entry, "value")
        if kind == "int_value":
            value = decoded_int(f"config key {entry.key!r}", value, INT64_MIN, INT64_MAX)
        if not isinstance(value, bool | int | float | str):
            invalid(f"config key {entry.key!r} has no value")
        config[entry.key] = value
    return config


def run_to_pb(run: Run, bundle: Digest) -> pb.Run:
    """What a node is told about ``run``, whose app bundle has digest ``bundle``."""
    message = pb.Run(
        run_id=int_in("run_id", run.run_id, 0, UINT64_MAX),
        run_config=config_to_pb(run.run_config),
        bundle_size=bundle.size,
        bundle_sha256=bundle.sha256,
        status=pb.RunStatus(_RUN_STATUSES[run.status]),
        status_reason=run.reason,
    )
    if run.seed is not None:
        message.seed = int_in("seed", run.seed, INT64_MIN, INT64_MAX)
    return message


def run_from_pb(message: pb.Run) -> tuple[Run, Digest]:
    """The run ``message`` describes, and its app bundle's digest."""
    status = _PB_RUN_STATUSES.get(message.status)
    if status is None:
        invalid(f"unknown run status {message.status!r}")
    seed = message.seed
    if seed is not None:
        decoded_int("seed", seed, INT64_MIN, INT64_MAX)
    run = Run(
        run_id=decoded_int("run_id", message.run_id, 0, UINT64_MAX),
        run_config=config_from_pb(message.run_config),
        status=status,
        reason=message.status_reason,
        seed=seed,
    )
    return run, digest_of_fields(message.bundle_size, message.bundle_sha256, "run bundle")


def registration_to_pb(
    node_config: Mapping[str, object], heartbeat_interval: float
) -> pb.RegisterNodeRequest:
    """A node's request to join: its config and how often it will heartbeat."""
    interval = seconds("heartbeat_interval", heartbeat_interval)
    return pb.RegisterNodeRequest(
        node_config=config_to_pb(node_config), heartbeat_interval=interval
    )


def registration_from_pb(
    request: pb.RegisterNodeRequest,
) -> tuple[dict[str, UserConfigValue], float]:
    """The node config and heartbeat interval of a request to join."""
    try:
        interval = seconds("heartbeat_interval", request.heartbeat_interval)
    except ValueError as exc:
        invalid(str(exc), exc)
    return config_from_pb(request.node_config), interval


# Outcomes ------------------------------------------------------------------------

_REJECTIONS: tuple[tuple[type[FedcoreError], int], ...] = (
    (DecodeError, pb.RejectReason.INVALID),
    (NodeNotFoundError, pb.RejectReason.UNKNOWN_NODE),
    (MessageNotFoundError, pb.RejectReason.UNKNOWN_MESSAGE),
    (ConflictError, pb.RejectReason.CONFLICT),
    (ReplyRejectedError, pb.RejectReason.CLOSED),
    (RunFinishedError, pb.RejectReason.RUN_FINISHED),
)


def push_reply_response(pushed: PushedReply) -> pb.PushReplyResponse:
    """The link's answer to a reply it stored, or had stored already."""
    if not pushed.reply_id:
        raise ValueError("a stored reply has an id")
    outcome = pb.PushReplyOutcome.DUPLICATE if pushed.duplicate else pb.PushReplyOutcome.STORED
    return pb.PushReplyResponse(outcome=pb.PushReplyOutcome(outcome), reply_id=pushed.reply_id)


def push_reply_rejection(error: FedcoreError) -> pb.PushReplyResponse:
    """The link's answer to a reply it refused with ``error``, one of the reasons' errors."""
    for kind, reason in _REJECTIONS:
        if isinstance(error, kind):
            detail = str(error)[:MAX_DETAIL]
            return pb.PushReplyResponse(
                outcome=pb.PushReplyOutcome(pb.PushReplyOutcome.REJECTED),
                reason=pb.RejectReason(reason),
                detail=detail,
            )
    raise TypeError(f"{type(error).__name__} is not a reason to reject a reply")


def push_reply_result(response: pb.PushReplyResponse) -> PushedReply:
    """What became of a pushed reply; a rejection raises its fedcore error."""
    if response.outcome == pb.PushReplyOutcome.REJECTED:
        for kind, reason in _REJECTIONS:
            if response.reason == reason:
                raise kind(f"the link rejected the reply: {response.detail[:MAX_DETAIL]}")
        invalid(f"a rejected reply has unknown reason {response.reason!r}")
    if response.outcome not in (pb.PushReplyOutcome.STORED, pb.PushReplyOutcome.DUPLICATE):
        invalid(f"unknown push outcome {response.outcome!r}")
    if not response.reply_id:
        invalid("a stored reply needs its id")
    return PushedReply(response.reply_id, response.outcome == pb.PushReplyOutcome.DUPLICATE)
