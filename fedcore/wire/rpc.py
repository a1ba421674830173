"""The fleet API's RPCs as bytes: what each method sends, encoded and decoded.

Transport code moves these frames and never sees a protobuf class: every
``encode_*`` builds the bytes of one gRPC message from domain objects (raising
``TypeError``/``ValueError`` for what the wire cannot carry), and every ``decode_*``
takes untrusted bytes through :func:`~fedcore.wire.protobuf.parse` and raises
:class:`~fedcore.errors.DecodeError`. Chunk streams (bundles, payloads) are framed
by :class:`ChunkWriter` and checked by :class:`ChunkReader`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum

import betterproto

from fedcore.domain import Message, RecordDict, Run, UserConfigValue
from fedcore.domain.fleet import Digest, LeasedMessage, PayloadRef, PulledMessages, PushedReply
from fedcore.domain.message import assemble_message
from fedcore.errors import FedcoreError, NodeNotFoundError
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.chunks import CHUNK_SIZE, ChunkVerifier
from fedcore.wire.flat import FlatCodec
from fedcore.wire.fleet import (
    MAX_INLINE_CONTENT,
    message_from_pb,
    message_to_pb,
    payload_ref,
    push_reply_rejection,
    push_reply_response,
    push_reply_result,
    registration_from_pb,
    registration_to_pb,
    run_from_pb,
    run_to_pb,
)
from fedcore.wire.frame import DEFAULT_LIMITS, Buffer
from fedcore.wire.message import METADATA_FIELDS, decode_metadata
from fedcore.wire.protobuf import (
    FRAME_CAP,
    INT64_MAX,
    decoded_int,
    int_in,
    invalid,
    parse,
    seconds,
)


class FleetMethod(Enum):
    """The fleet API's methods, by their gRPC path."""

    REGISTER_NODE = "/fedcore.v1.Fleet/RegisterNode"
    UNREGISTER_NODE = "/fedcore.v1.Fleet/UnregisterNode"
    HEARTBEAT = "/fedcore.v1.Fleet/Heartbeat"
    HEARTBEATS = "/fedcore.v1.Fleet/Heartbeats"
    PULL_MESSAGES = "/fedcore.v1.Fleet/PullMessages"
    PUSH_REPLY = "/fedcore.v1.Fleet/PushReply"
    GET_RUN = "/fedcore.v1.Fleet/GetRun"
    GET_BUNDLE = "/fedcore.v1.Fleet/GetBundle"
    PUSH_PAYLOAD = "/fedcore.v1.Fleet/PushPayload"
    PULL_PAYLOAD = "/fedcore.v1.Fleet/PullPayload"


MAX_CONFIG_ENTRIES = 1024
"""The most entries a node config may have on the wire."""
MAX_HEARTBEAT_IDS = 1024
"""The most message ids one heartbeat may extend (a node handles that many at once at most)."""
_MAX_FIELDS = 64
"""The most fields any other request message (or one nested in it) may have: they have ten."""
SMALL_REQUEST = 4 * 1024
"""The frame cap of requests that carry a few ids and numbers."""

# The messages a node sends and gets all the time are flat: they skip betterproto.
_REGISTER_NODE_RESPONSE = FlatCodec(pb.RegisterNodeResponse)
_UNREGISTER_NODE_REQUEST = FlatCodec(pb.UnregisterNodeRequest)
_HEARTBEAT_REQUEST = FlatCodec(pb.HeartbeatRequest)
_HEARTBEAT_FRAME = FlatCodec(pb.HeartbeatFrame)
_HEARTBEAT_RESPONSE = FlatCodec(pb.HeartbeatResponse)
_PULL_MESSAGES_REQUEST = FlatCodec(pb.PullMessagesRequest)

REQUEST_CAPS: dict[FleetMethod, int] = {
    FleetMethod.REGISTER_NODE: 64 * 1024,
    FleetMethod.UNREGISTER_NODE: SMALL_REQUEST,
    FleetMethod.HEARTBEAT: 64 * 1024,
    FleetMethod.HEARTBEATS: 64 * 1024 + 64,
    FleetMethod.PULL_MESSAGES: SMALL_REQUEST,
    FleetMethod.PUSH_REPLY: MAX_INLINE_CONTENT + 64 * 1024,
    FleetMethod.GET_RUN: SMALL_REQUEST,
    FleetMethod.GET_BUNDLE: SMALL_REQUEST,
    FleetMethod.PUSH_PAYLOAD: FRAME_CAP,
    FleetMethod.PULL_PAYLOAD: SMALL_REQUEST,
}
"""The largest request frame of each method, refused from its length prefix before any of
it is read. A registration's node config is small; a reply's content over
:data:`~fedcore.wire.fleet.MAX_INLINE_CONTENT` travels as a payload, whose chunks alone
fill a whole frame. The 64 KiB over the inline limit hold a reply's metadata."""


def _node_id(value: int) -> int:
    return int_in("node_id", value, 1, INT64_MAX)


def _decoded_node_id(value: int) -> int:
    return decoded_int("node_id", value, 1, INT64_MAX)


def _decoded_seconds(name: str, value: float, *, zero: bool) -> float:
    """A decoded duration: positive and finite, or also 0 when ``zero`` allows it."""
    if zero and value == 0:
        return 0.0
    try:
        return seconds(name, value)
    except ValueError as exc:
        invalid(str(exc), exc)


def _decoded_time(name: str, value: float) -> float:
    if not math.isfinite(value):
        invalid(f"{name} must be a finite time, got {value!r}")
    return value


def encode_register_node_request(
    node_config: Mapping[str, object], heartbeat_interval: float
) -> bytes:
    return bytes(registration_to_pb(node_config, heartbeat_interval))


def decode_register_node_request(frame: Buffer) -> tuple[dict[str, UserConfigValue], float]:
    """The node config and heartbeat interval of a request to join."""
    return registration_from_pb(parse(pb.RegisterNodeRequest, frame, max_fields=MAX_CONFIG_ENTRIES))


def encode_register_node_response(node_id: int) -> bytes:
    return _REGISTER_NODE_RESPONSE.encode(node_id=_node_id(node_id))


def decode_register_node_response(frame: Buffer) -> int:
    """The id the link gave the new node."""
    return _decoded_node_id(_REGISTER_NODE_RESPONSE.decode(frame)["node_id"])


def encode_unregister_node_request(node_id: int) -> bytes:
    return _UNREGISTER_NODE_REQUEST.encode(node_id=_node_id(node_id))


def decode_unregister_node_request(frame: Buffer) -> int:
    """The id of the node leaving."""
    request = _UNREGISTER_NODE_REQUEST.decode(frame, max_fields=_MAX_FIELDS)
    return _decoded_node_id(request["node_id"])


def encode_unregister_node_response() -> bytes:
    return bytes(pb.UnregisterNodeResponse())


def decode_unregister_node_response(frame: Buffer) -> None:
    parse(pb.UnregisterNodeResponse, frame)


def encode_heartbeat_request(
    node_id: int,
    heartbeat_interval: float,
    message_ids: Sequence[str] = (),
    lease_seconds: float | None = None,
) -> bytes:
    """A heartbeat; ``lease_seconds`` is required when ``message_ids`` is not empty."""
    ids = list(message_ids)
    if any(not isinstance(message_id, str) for message_id in ids):
        raise TypeError("message_ids must be strings")
    if ids and lease_seconds is None:
        raise ValueError("lease_seconds is required to extend the leases of message_ids")
    return _HEARTBEAT_REQUEST.encode(
        node_id=_node_id(node_id),
        heartbeat_interval=seconds("heartbeat_interval", heartbeat_interval),
        message_ids=ids,
        lease_seconds=seconds("lease_seconds", lease_seconds) if ids else 0.0,
    )


def decode_heartbeat_request(frame: Buffer) -> tuple[int, float, list[str], float | None]:
    """Node id, heartbeat interval, the ids worked on, and their new lease (None if no ids)."""
    request = _HEARTBEAT_REQUEST.decode(frame, max_fields=MAX_HEARTBEAT_IDS + 3)
    interval = _decoded_seconds("heartbeat_interval", request["heartbeat_interval"], zero=False)
    ids: list[str] = request["message_ids"]
    lease = _decoded_seconds("lease_seconds", request["lease_seconds"], zero=False) if ids else None
    return _decoded_node_id(request["node_id"]), interval, ids, lease


def encode_heartbeat_frame(request: bytes, mac: bytes) -> bytes:
    """One frame of a Heartbeats call: an encoded heartbeat request and its MAC."""
    return _HEARTBEAT_FRAME.encode(request=request, mac=mac)


def decode_heartbeat_frame(frame: Buffer) -> tuple[bytes, bytes]:
    """The encoded heartbeat request a Heartbeats frame carries, and its MAC (unchecked)."""
    decoded = _HEARTBEAT_FRAME.decode(frame)
    return decoded["request"], decoded["mac"]


def encode_heartbeat_response(*, known: bool, released: Sequence[str] = ()) -> bytes:
    """The link's answer to a heartbeat: whether it knows the node, and the leases it let go."""
    status = pb.NodeStatus.ONLINE if known else pb.NodeStatus.UNKNOWN
    return _HEARTBEAT_RESPONSE.encode(status=status, released_message_ids=list(released))


def decode_heartbeat_response(frame: Buffer, node_id: int) -> list[str]:
    """The ids of the messages whose leases the link let go.

    ``NodeNotFoundError`` tells the node its id is dead for good (deleted,
    unregistered, or never known): it must register again.
    """
    response = _HEARTBEAT_RESPONSE.decode(frame)
    if response["status"] == pb.NodeStatus.UNKNOWN:
        raise NodeNotFoundError(f"the link does not know node {node_id}: register again")
    if response["status"] != pb.NodeStatus.ONLINE:
        invalid(f"unknown node status {response['status']!r}")
    released: list[str] = response["released_message_ids"]
    return released


def encode_pull_messages_request(
    node_id: int, limit: int, lease_seconds: float | None, wait_seconds: float
) -> bytes:
    """A pull of up to ``limit`` messages; ``lease_seconds=None`` asks for the link's default."""
    if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, int | float):
        raise TypeError(f"wait_seconds must be a number, got {type(wait_seconds).__name__}")
    if not 0 <= wait_seconds < math.inf:
        raise ValueError(f"wait_seconds must be 0 or positive and finite, got {wait_seconds!r}")
    return _PULL_MESSAGES_REQUEST.encode(
        node_id=_node_id(node_id),
        max_messages=int_in("limit", limit, 1, 2**32 - 1),
        lease_seconds=0.0 if lease_seconds is None else seconds("lease_seconds", lease_seconds),
        wait_seconds=float(wait_seconds),
    )


def decode_pull_messages_request(frame: Buffer) -> tuple[int, int, float | None, float]:
    """Node id, limit, lease seconds (None: the link's default) and seconds to wait."""
    request = _PULL_MESSAGES_REQUEST.decode(frame, max_fields=_MAX_FIELDS)
    limit = decoded_int("max_messages", request["max_messages"], 1, 2**32 - 1)
    lease = _decoded_seconds("lease_seconds", request["lease_seconds"], zero=True) or None
    wait = _decoded_seconds("wait_seconds", request["wait_seconds"], zero=True)
    return _decoded_node_id(request["node_id"]), limit, lease, wait


_PULLED_MESSAGE_TAG = bytes([1 << 3 | 2])
"""PullMessagesResponse.messages: field 1, length-delimited."""
_PULLED_NOW_TAG = bytes([2 << 3 | 1])
"""PullMessagesResponse.now: field 2, a 64-bit double."""


def encode_pull_messages_response(pulled: PulledMessages) -> tuple[bytes, int]:
    """The response frame and how many of ``pulled.messages`` (a prefix) fit in it.

    A frame holds what fits under the frame cap; the rest stay leased and come
    again once their leases run out. A first message that fits on no frame raises
    ``ValueError``: its content should have travelled as a payload.
    """
    # The frame is assembled from each entry's encoding, so that every message is
    # encoded once: measuring entries and then encoding the response whole would
    # encode them twice.
    now = _PULLED_NOW_TAG + struct.pack("<d", pulled.now)
    pieces: list[bytes] = []
    size = len(now)
    for leased in pulled.messages:
        entry = bytes(
            pb.LeasedMessage(
                message=message_to_pb(leased.message, payload=leased.payload),
                lease_expires_at=leased.lease_expires_at,
            )
        )
        header = _PULLED_MESSAGE_TAG + betterproto.encode_varint(len(entry))
        if size + len(header) + len(entry) > FRAME_CAP:
            if not pieces:
                raise ValueError(f"a leased message of {len(entry)} bytes is over the frame cap")
            break
        pieces += (header, entry)
        size += len(header) + len(entry)
    return b"".join([*pieces, now]), len(pieces) // 2


def decode_pull_messages_response(frame: Buffer) -> PulledMessages:
    """The leased messages; those whose content is a payload come with its reference."""
    response = parse(pb.PullMessagesResponse, frame)
    messages = []
    for entry in response.messages:
        if not betterproto.serialized_on_wire(entry.message):
            invalid("a leased message needs its message")
        message, ref = _message_and_payload(entry.message)
        expires = _decoded_time("lease_expires_at", entry.lease_expires_at)
        messages.append(LeasedMessage(message, expires, ref))
    return PulledMessages(_decoded_time("now", response.now), tuple(messages))


def _message_and_payload(message: pb.Message) -> tuple[Message, PayloadRef | None]:
    """The message, with an empty RecordDict standing for content that is a payload."""
    ref = payload_ref(message)
    if ref is None:
        return message_from_pb(message), None
    if not betterproto.serialized_on_wire(message.metadata):
        invalid("a message needs metadata")
    metadata = decode_metadata([getattr(message.metadata, name) for name, _ in METADATA_FIELDS])
    return assemble_message(metadata, content=RecordDict()), ref


def encode_push_reply_request(
    node_id: int, reply: Message, payload: PayloadRef | None = None
) -> bytes:
    """A reply to push; with ``payload``, its content is that payload, pushed before."""
    if not reply.is_reply:
        raise ValueError("push_reply takes a reply: a Message built with reply_to=")
    return bytes(
        pb.PushReplyRequest(node_id=_node_id(node_id), reply=message_to_pb(reply, payload=payload))
    )


def decode_push_reply_request(frame: Buffer) -> tuple[int, Message, PayloadRef | None]:
    """Node id, the reply, and the payload its content is (its content is then empty)."""
    request = parse(pb.PushReplyRequest, frame, max_fields=_MAX_FIELDS)
    if not betterproto.serialized_on_wire(request.reply):
        invalid("a push needs its reply")
    reply, ref = _message_and_payload(request.reply)
    if not reply.is_reply:
        invalid("a pushed reply needs reply_to_message_id")
    return _decoded_node_id(request.node_id), reply, ref


def encode_push_reply_response(outcome: PushedReply | FedcoreError) -> bytes:
    """The link's answer: the reply stored, or the error it was refused with."""
    if isinstance(outcome, PushedReply):
        return bytes(push_reply_response(outcome))
    return bytes(push_reply_rejection(outcome))


def decode_push_reply_response(frame: Buffer) -> PushedReply:
    """What became of the reply; a rejection raises its fedcore error."""
    return push_reply_result(parse(pb.PushReplyResponse, frame))


def encode_get_run_request(node_id: int, run_id: int) -> bytes:
    return bytes(
        pb.GetRunRequest(node_id=_node_id(node_id), run_id=int_in("run_id", run_id, 1, INT64_MAX))
    )


def decode_get_run_request(frame: Buffer) -> tuple[int, int]:
    """Node id and run id."""
    request = parse(pb.GetRunRequest, frame, max_fields=_MAX_FIELDS)
    run_id = decoded_int("run_id", request.run_id, 1, INT64_MAX)
    return _decoded_node_id(request.node_id), run_id


def encode_get_run_response(run: Run, bundle: Digest) -> bytes:
    return bytes(pb.GetRunResponse(run=run_to_pb(run, bundle)))


def decode_get_run_response(frame: Buffer) -> tuple[Run, Digest]:
    """The run and its app bundle's digest."""
    response = parse(pb.GetRunResponse, frame)
    if not betterproto.serialized_on_wire(response.run):
        invalid("GetRun's response needs its run")
    return run_from_pb(response.run)


def encode_get_bundle_request(node_id: int, run_id: int) -> bytes:
    return bytes(
        pb.GetBundleRequest(
            node_id=_node_id(node_id), run_id=int_in("run_id", run_id, 1, INT64_MAX)
        )
    )


def decode_get_bundle_request(frame: Buffer) -> tuple[int, int]:
    """Node id and run id."""
    request = parse(pb.GetBundleRequest, frame, max_fields=_MAX_FIELDS)
    run_id = decoded_int("run_id", request.run_id, 1, INT64_MAX)
    return _decoded_node_id(request.node_id), run_id


def encode_pull_payload_request(node_id: int, payload_id: str) -> bytes:
    if not isinstance(payload_id, str) or not payload_id:
        raise ValueError(f"payload_id must be a non-empty str, got {payload_id!r}")
    return bytes(pb.PullPayloadRequest(node_id=_node_id(node_id), payload_id=payload_id))


def decode_pull_payload_request(frame: Buffer) -> tuple[int, str]:
    """Node id and payload id."""
    request = parse(pb.PullPayloadRequest, frame, max_fields=_MAX_FIELDS)
    if not request.payload_id:
        invalid("PullPayload needs a payload id")
    return _decoded_node_id(request.node_id), request.payload_id


def encode_push_payload_response(payload_id: str) -> bytes:
    if not isinstance(payload_id, str) or not payload_id:
        raise ValueError(f"payload_id must be a non-empty str, got {payload_id!r}")
    return bytes(pb.PushPayloadResponse(payload_id=payload_id))


def decode_push_payload_response(frame: Buffer) -> str:
    """The id the link gave the payload."""
    payload_id = parse(pb.PushPayloadResponse, frame).payload_id
    if not payload_id:
        invalid("PushPayload's response needs a payload id")
    return payload_id


class ChunkWriter:
    """Frames a transfer of known digest: Chunk frames, or PushPayload requests with ``upload``.

    ``upload=(node_id, message_id)`` makes PushPayload request frames; without it,
    the Chunk frames that GetBundle and PullPayload stream. Each piece of data given
    to :meth:`frames` is split into chunks of at most ``chunk_size`` bytes, with
    offsets following on; :meth:`finish` checks the pieces added up to the digest.
    """

    __slots__ = ("_chunk_size", "_digest", "_offset", "_sent", "_upload")

    def __init__(
        self,
        digest: Digest,
        *,
        upload: tuple[int, str] | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        if type(chunk_size) is not int or not 1 <= chunk_size <= CHUNK_SIZE:
            raise ValueError(
                f"chunk_size must be an int from 1 to {CHUNK_SIZE}, got {chunk_size!r}"
            )
        if upload is not None:
            node_id, message_id = upload
            if not isinstance(message_id, str) or not message_id:
                raise ValueError(f"message_id must be a non-empty str, got {message_id!r}")
            upload = (_node_id(node_id), message_id)
        self._digest = digest
        self._upload = upload
        self._chunk_size = chunk_size
        self._offset = 0
        self._sent = False

    def frames(self, data: Buffer) -> Iterator[bytes]:
        """The frames for ``data``, the next bytes of the transfer, one chunk each."""
        view = memoryview(data).cast("B")
        if self._offset + len(view) > self._digest.size:
            raise ValueError(f"the transfer runs past the {self._digest.size} bytes of its digest")
        for start in range(0, len(view), self._chunk_size):
            yield self._frame(view[start : start + self._chunk_size])

    def finish(self) -> list[bytes]:
        """The frames still to send: the one empty chunk of an empty transfer, else none.

        Raises ``ValueError`` when the data given fell short of the digest's size.
        """
        if self._offset != self._digest.size:
            raise ValueError(
                f"the transfer had {self._offset} bytes, its digest says {self._digest.size}"
            )
        return [] if self._sent else [self._frame(memoryview(b""))]

    def _frame(self, piece: memoryview) -> bytes:
        chunk = pb.Chunk(
            offset=self._offset,
            data=bytes(piece),
            total_size=self._digest.size,
            sha256=self._digest.sha256,
        )
        self._offset += len(piece)
        self._sent = True
        if self._upload is None:
            return bytes(chunk)
        node_id, message_id = self._upload
        return bytes(pb.PushPayloadRequest(node_id=node_id, message_id=message_id, chunk=chunk))


class ChunkReader:
    """Reads a transfer's frames in order, checking each chunk as it comes (ChunkVerifier).

    :attr:`digest` is known from the first chunk on, and was checked against
    ``max_size`` before anything else was taken. A PushPayload stream also names
    its node and message in every frame: :meth:`upload` checks they never change.
    """

    __slots__ = ("_digest", "_ids", "_verifier")

    def __init__(self, *, max_size: int = DEFAULT_LIMITS.max_bytes) -> None:
        self._verifier = ChunkVerifier(max_size=max_size)
        self._digest: Digest | None = None
        self._ids: tuple[int, str] | None = None

    @property
    def digest(self) -> Digest:
        """The transfer's size and hash, as its first chunk declared them."""
        if self._digest is None:
            raise ValueError("no chunk has been read yet")
        return self._digest

    @property
    def upload_ids(self) -> tuple[int, str]:
        """The node and message a PushPayload stream names."""
        if self._ids is None:
            raise ValueError("no upload frame has been read yet")
        return self._ids

    def chunk(self, frame: Buffer) -> bytes:
        """The data of the next Chunk frame (GetBundle, PullPayload)."""
        return self._check(parse(pb.Chunk, frame))

    def upload(self, frame: Buffer) -> bytes:
        """The data of the next PushPayload request frame."""
        request = parse(pb.PushPayloadRequest, frame, max_fields=_MAX_FIELDS)
        ids = (_decoded_node_id(request.node_id), request.message_id)
        if not request.message_id:
            invalid("PushPayload needs a message id")
        if self._ids is None:
            self._ids = ids
        elif ids != self._ids:
            invalid("every PushPayload request must name the same node and message")
        if not betterproto.serialized_on_wire(request.chunk):
            invalid("a PushPayload request needs its chunk")
        return self._check(request.chunk)

    def finish(self) -> Digest:
        """Check the transfer is whole and its hash right; return its digest."""
        return self._verifier.finish()

    def _check(self, chunk: pb.Chunk) -> bytes:
        data = self._verifier.check(chunk)
        if self._digest is None:
            self._digest = Digest(chunk.total_size, chunk.sha256)
        return data
