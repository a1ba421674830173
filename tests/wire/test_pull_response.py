"""PullMessages' response frame: assembled from each entry's encoding, under the frame cap."""

from __future__ import annotations

import numpy as np

from fedcore import ArrayRecord, Message, RecordDict
from fedcore.domain.fleet import Digest, LeasedMessage, PayloadRef, PulledMessages
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.fleet import MAX_INLINE_CONTENT
from fedcore.wire.protobuf import FRAME_CAP, parse
from fedcore.wire.rpc import decode_pull_messages_response, encode_pull_messages_response


def _leased(index: int, floats: int, *, payload: PayloadRef | None = None) -> LeasedMessage:
    content = RecordDict({"a": ArrayRecord({"w": np.full(floats, index, dtype=np.float32)})})
    message = Message(RecordDict() if payload else content, 1000 + index, "train")
    message.metadata.message_id = f"m{index}"
    message.metadata.run_id = 7
    return LeasedMessage(message, 1_700_000_000.0 + index, payload)


def test_the_frame_round_trips_and_parses_as_the_protobuf_response() -> None:
    ref = PayloadRef("p", Digest.of(b"payload bytes"))
    pulled = PulledMessages(1_800_000_000.25, (_leased(1, 10), _leased(2, 0, payload=ref)))
    frame, count = encode_pull_messages_response(pulled)
    assert count == 2
    decoded = decode_pull_messages_response(frame)
    assert decoded.now == pulled.now
    assert [m.message.metadata.message_id for m in decoded.messages] == ["m1", "m2"]
    assert [m.lease_expires_at for m in decoded.messages] == [1_700_000_001.0, 1_700_000_002.0]
    np.testing.assert_array_equal(decoded.messages[0].message.content["a"]["w"], np.ones(10))
    assert decoded.messages[1].payload == ref
    response = parse(pb.PullMessagesResponse, frame)
    assert bytes(response) == frame  # what betterproto would have encoded, field for field


def test_an_empty_pull_is_just_the_time() -> None:
    frame, count = encode_pull_messages_response(PulledMessages(12.5, ()))
    assert count == 0
    assert decode_pull_messages_response(frame) == PulledMessages(12.5, ())


def test_messages_past_the_frame_cap_are_left_for_later() -> None:
    floats = (MAX_INLINE_CONTENT - 1024) // 4  # each just under the inline limit
    many = tuple(_leased(i, floats) for i in range(FRAME_CAP // MAX_INLINE_CONTENT + 20))
    frame, count = encode_pull_messages_response(PulledMessages(1.0, many))
    assert len(frame) <= FRAME_CAP
    assert 0 < count < len(many)
    decoded = decode_pull_messages_response(frame)
    assert [m.message.metadata.message_id for m in decoded.messages] == [
        f"m{i}" for i in range(count)
    ]
