from __future__ import annotations

from typing import Any

import pytest

from fedcore import ConfigRecord, Error, ErrorCode, Message, RecordDict
from fedcore.clock import using_clock
from fedcore.domain import DEFAULT_TTL, SERVER_NODE_ID, Metadata
from fedcore.errors import MessageInitializationError
from fedcore.testing import FakeClock


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


@pytest.mark.parametrize(
    "message_type", ["train", "evaluate.full", "query.x_1", "train.fast_2", "train._private"]
)
def test_valid_message_types(message_type: str) -> None:
    assert Message(RecordDict(), 1, message_type).metadata.message_type == message_type


@pytest.mark.parametrize(
    "message_type",
    ["fit", "", "train.", "train.a b", "Train", "train.no-hyphen", "train.123", "train.a.b"],
)
def test_invalid_message_types(message_type: str) -> None:
    """An action is a Python identifier, as Flower's ``validate_message_type`` has it."""
    with pytest.raises(ValueError, match="message_type"):
        Message(RecordDict(), 1, message_type)


def test_a_message_type_that_is_no_str_is_a_type_error() -> None:
    with pytest.raises(MessageInitializationError):
        Message(RecordDict(), 1, None)  # type: ignore[call-overload]


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
    assert reply.error.describe() == "error 2 (CLIENT_APP_RAISED_EXCEPTION): boom"
    with pytest.raises(ValueError, match="carries an error"):
        _ = reply.content


def test_error_and_metadata_print_as_flower_prints_them() -> None:
    assert str(Error(1, "why")) == "Error(code=1, reason='why')"
    meta = Metadata(3, "m", 1, 2, "r", "g", 1.5, 10.0, "query")
    meta.delivered_at = "2026-01-01T00:00:00+00:00"
    assert str(meta) == (
        "Metadata(run_id=3, message_id='m', src_node_id=1, dst_node_id=2, "
        "reply_to_message_id='r', group_id='g', created_at=1.5, ttl=10.0, message_type='query')"
    )


def test_a_message_prints_as_flower_prints_one() -> None:
    reply = Message(Error(3, "gone"), reply_to=_sent())
    assert (
        repr(reply) == f"Message(metadata={reply.metadata!r}, error=Error(code=3, reason='gone'))"
    )
    sent = _sent()
    assert repr(sent) == f"Message(metadata={sent.metadata!r}, content={sent.content!r})"


def test_content_xor_error() -> None:
    with pytest.raises(MessageInitializationError, match="exactly one"):
        Message(RecordDict(), error=Error(0), reply_to=_sent())  # type: ignore[call-overload]
    with pytest.raises(MessageInitializationError, match="exactly one"):
        Message(reply_to=_sent())  # type: ignore[call-overload]
    with pytest.raises(MessageInitializationError, match="only a reply"):
        Message(error=Error(0), dst_node_id=1, message_type="train")  # type: ignore[call-overload]
    message = _sent()
    with pytest.raises(ValueError, match="content, not an error"):
        _ = message.error


def test_reply_rejects_routing_arguments_and_replies_to_replies() -> None:
    original = _sent()
    with pytest.raises(MessageInitializationError, match="takes its destination"):
        Message(RecordDict(), 3, reply_to=original)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="reply to a reply"):
        Message(RecordDict(), reply_to=Message(RecordDict(), reply_to=original))


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan")])
def test_a_ttl_that_is_not_positive_and_finite_is_a_value_error(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Message(RecordDict(), 1, "train", ttl=ttl)
    with pytest.raises(ValueError, match="ttl"):
        Message(RecordDict(), reply_to=_sent(), ttl=ttl)


@pytest.mark.parametrize("ttl", ["10", True])
def test_a_ttl_that_is_no_number_is_a_type_error(ttl: object) -> None:
    with pytest.raises(MessageInitializationError, match="ttl"):
        Message(RecordDict(), 1, "train", ttl=ttl)  # type: ignore[arg-type]


def test_bad_argument_types() -> None:
    with pytest.raises(TypeError, match="RecordDict"):
        Message({"a": 1}, 1, "train")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="dst_node_id"):
        Message(RecordDict(), "1", "train")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="dst_node_id"):
        Message(RecordDict(), True, "train")
    with pytest.raises(TypeError, match="error"):
        Message(error="boom", reply_to=_sent())  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((RecordDict(), 1, "train", 5), {}),
        ((RecordDict(), 1), {}),
        ((RecordDict(), 1, "train"), {"dst_node_id": 1}),
        ((RecordDict(), 1, "train"), {"message_type": "train"}),
        ((RecordDict(), 1, "train"), {"content": RecordDict()}),
        ((RecordDict(), 1, "train"), {"metadata": Metadata()}),
        ((Error(0), 1, "train"), {}),
        ((RecordDict(), 1, "train"), {"group_id": 7}),
    ],
)
def test_arguments_that_fit_no_form_are_a_type_error(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Every form Flower refuses with its MessageInitializationError, a TypeError."""
    with pytest.raises(MessageInitializationError):
        Message(*args, **kwargs)
    assert issubclass(MessageInitializationError, TypeError)


def test_an_error_reply_may_be_given_positionally() -> None:
    reply = Message(Error(3, "gone"), reply_to=_sent())
    assert reply.error == Error(3, "gone")
    assert not reply.has_content()


def test_content_and_error_cannot_be_swapped_by_their_setters() -> None:
    reply = Message(RecordDict(), reply_to=_sent())
    with pytest.raises(ValueError, match="carries content"):
        reply.error = Error(5, "gone")
    reply.content = RecordDict({"c": ConfigRecord({"a": 1})})
    failed = Message(Error(5, "gone"), reply_to=_sent())
    with pytest.raises(ValueError, match="carries an error"):
        failed.content = RecordDict()
    failed.error = Error(6, "later")
    assert failed.error.code == 6


def test_a_message_is_stamped_with_its_creation_time_by_the_context_clock() -> None:
    clock = FakeClock(start=1000.0)
    with using_clock(clock):
        message = Message(RecordDict(), 1, "train", ttl=60)
        clock.advance(15.0)
        reply = Message(RecordDict(), reply_to=message)
    assert message.metadata.created_at == 1000.0
    assert reply.metadata.created_at == 1015.0
    assert reply.metadata.ttl == 45.0  # what the message has left


@pytest.mark.parametrize(("asked", "expected"), [(30.0, 20.0), (20.05, 20.05), (10.0, 10.0)])
def test_a_reply_ttl_is_cut_to_what_its_message_has_left(asked: float, expected: float) -> None:
    """Flower's rule: beyond the message's expiry by more than 0.1 s, the ttl is cut."""
    clock = FakeClock(start=1000.0)
    with using_clock(clock):
        message = Message(RecordDict(), 1, "train", ttl=20)
        reply = Message(RecordDict(), reply_to=message, ttl=asked)
    assert reply.metadata.ttl == expected


def test_a_reply_ttl_is_never_more_than_its_messages() -> None:
    """A message stamped by a clock behind this one has more than its ttl left."""
    message = Message(RecordDict(), 1, "train", ttl=60)
    message.metadata.created_at += 3600.0
    assert Message(RecordDict(), reply_to=message).metadata.ttl == 60.0


def test_a_reply_to_a_message_with_no_time_left_keeps_its_ttl() -> None:
    """A message stamped by another clock (the link's, ahead) or already expired bounds
    nothing at construction: the link that stores the reply decides."""
    original = _sent()  # created at 100.0, ttl 12 hours: long gone by the system clock
    assert Message(RecordDict(), reply_to=original).metadata.ttl == DEFAULT_TTL
    assert Message(RecordDict(), reply_to=original, ttl=30).metadata.ttl == 30.0


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
