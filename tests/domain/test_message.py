from __future__ import annotations

import pytest

from fedcore import ConfigRecord, Error, ErrorCode, Message, RecordDict
from fedcore.domain import DEFAULT_TTL, SERVER_NODE_ID


def _sent(node_id: int = 7, message_type: str = "train") -> Message:
    message = Message(
        RecordDict({"config": ConfigRecord({"lr": 0.1})}), node_id, message_type, group_id="r1"
    )
    meta = message.metadata
    meta.run_id, meta.message_id, meta.src_node_id, meta.created_at = 3, "m1", SERVER_NODE_ID, 100.0
    return message


def test_server_message_metadata() -> None:
    message = Message(RecordDict(), 5, "evaluate", group_id="g", ttl=60)
    meta = message.metadata
    assert (meta.dst_node_id, meta.message_type, meta.group_id, meta.ttl) == (
        5,
        "evaluate",
        "g",
        60.0,
    )
    assert Message(RecordDict(), 5, "query").metadata.ttl == DEFAULT_TTL


@pytest.mark.parametrize("message_type", ["train", "evaluate.full", "query.x-1", "train.fast_2"])
def test_valid_message_types(message_type: str) -> None:
    assert Message(RecordDict(), 1, message_type).metadata.message_type == message_type


@pytest.mark.parametrize("message_type", ["fit", "", "train.", "train.a b", "Train", None])
def test_invalid_message_types(message_type: str) -> None:
    with pytest.raises(ValueError, match="message_type"):
        Message(RecordDict(), 1, message_type)


def test_reply_inherits_routing() -> None:
    original = _sent()
    reply = Message(RecordDict(), reply_to=original)
    meta = reply.metadata
    assert meta.reply_to_message_id == "m1"
    assert (meta.src_node_id, meta.dst_node_id) == (7, SERVER_NODE_ID)
    assert (meta.run_id, meta.group_id, meta.message_type) == (3, "r1", "train")
    assert meta.message_id == ""
    assert reply.is_reply
    assert not original.is_reply


def test_error_reply() -> None:
    reply = Message(error=Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=_sent())
    assert reply.has_error()
    assert not reply.has_content()
    assert reply.error.code == 2
    assert str(reply.error) == "error 2 (CLIENT_APP_RAISED_EXCEPTION): boom"
    with pytest.raises(ValueError, match="carries an error"):
        _ = reply.content


def test_content_xor_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Message(RecordDict(), error=Error(0), reply_to=_sent())
    with pytest.raises(ValueError, match="exactly one"):
        Message(reply_to=_sent())
    with pytest.raises(ValueError, match="only a reply"):
        Message(error=Error(0), dst_node_id=1, message_type="train")
    message = _sent()
    with pytest.raises(ValueError, match="content, not an error"):
        _ = message.error


def test_reply_rejects_routing_arguments_and_replies_to_replies() -> None:
    original = _sent()
    with pytest.raises(ValueError, match="takes its destination"):
        Message(RecordDict(), 3, reply_to=original)
    with pytest.raises(ValueError, match="reply to a reply"):
        Message(RecordDict(), reply_to=Message(RecordDict(), reply_to=original))


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan"), "10", True])
def test_bad_ttl(ttl: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Message(RecordDict(), 1, "train", ttl=ttl)  # type: ignore[arg-type]


def test_bad_argument_types() -> None:
    with pytest.raises(TypeError, match="RecordDict"):
        Message({"a": 1}, 1, "train")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dst_node_id"):
        Message(RecordDict(), "1", "train")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Error"):
        Message(error="boom", reply_to=_sent())  # type: ignore[arg-type]


def test_content_and_error_setters_switch_kind() -> None:
    reply = Message(RecordDict(), reply_to=_sent())
    reply.error = Error(5, "gone")
    assert reply.has_error()
    reply.content = RecordDict()
    assert reply.has_content()


def test_with_content_copies_metadata() -> None:
    original = _sent()
    clone = original.with_content(RecordDict())
    clone.metadata.group_id = "other"
    assert original.metadata.group_id == "r1"
    assert clone.metadata.message_id == "m1"


def test_equality() -> None:
    assert _sent() == _sent()
    other = _sent()
    other.metadata.ttl = 5
    assert _sent() != other
    with pytest.raises(TypeError):
        hash(_sent())
