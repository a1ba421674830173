"""The link's rules on their own: pure functions, facts in and effects out, no store."""

from __future__ import annotations

import math

import pytest

from fedcore.domain import (
    SERVER_NODE_ID,
    ErrorCode,
    Message,
    MessageStatus,
    Metadata,
    RecordDict,
    RunStatus,
)
from fedcore.domain.lifecycle import MESSAGE_TRANSITIONS, RUN_TRANSITIONS
from fedcore.errors import (
    ConflictError,
    InvalidTransitionError,
    MessageNotFoundError,
    ReplyRejectedError,
)
from fedcore.state import ledger


@pytest.mark.parametrize("current", list(RunStatus))
@pytest.mark.parametrize("status", list(RunStatus))
def test_a_run_moves_only_as_the_table_allows_and_drops_what_its_status_asks(
    current: RunStatus, status: RunStatus
) -> None:
    if status not in RUN_TRANSITIONS[current]:
        with pytest.raises(InvalidTransitionError):
            ledger.move_run(current, status, "why", 12.5)
        return
    move = ledger.move_run(current, status, "why", 12.5)
    assert (move.status, move.reason) == (status, "why")
    assert move.finished_at == (12.5 if status.finished else None)
    assert move.drop_claim == (status is RunStatus.PENDING)
    assert move.end_claim == status.finished


def test_a_claim_running_out_sends_the_run_back_until_the_last_attempt() -> None:
    for attempts in range(1, ledger.MAX_CLAIM_ATTEMPTS):
        move = ledger.claim_expired(RunStatus.STARTING, attempts, 3.0)
        assert move.status is RunStatus.PENDING
        assert move.drop_claim
        assert f"claim {attempts} ran out" in move.reason
    last = ledger.claim_expired(RunStatus.STARTING, ledger.MAX_CLAIM_ATTEMPTS, 3.0)
    assert (last.status, last.finished_at, last.end_claim) == (RunStatus.FAILED, 3.0, True)
    with pytest.raises(InvalidTransitionError):
        ledger.claim_expired(RunStatus.RUNNING, 1, 3.0)


def test_starting_a_running_run_again_is_a_retry_that_moves_nothing() -> None:
    move = ledger.started(RunStatus.STARTING, 1.0)
    assert move is not None
    assert move.status is RunStatus.RUNNING
    assert ledger.started(RunStatus.RUNNING, 1.0) is None
    with pytest.raises(InvalidTransitionError):
        ledger.started(RunStatus.PENDING, 1.0)


def test_a_silent_serverapp_fails_its_run_and_says_for_how_long() -> None:
    move = ledger.serverapp_silent(RunStatus.RUNNING, 3.0, 2.0, 9.0)
    assert (move.status, move.finished_at) == (RunStatus.FAILED, 9.0)
    assert "no heartbeat for 6 s" in move.reason


@pytest.mark.parametrize("current", list(MessageStatus))
def test_each_message_event_is_a_move_of_the_table(current: MessageStatus) -> None:
    allowed = MESSAGE_TRANSITIONS[current]
    for event, target in [
        (ledger.lease, MessageStatus.LEASED),
        (ledger.lease_ends, MessageStatus.PENDING),
        (ledger.replied, MessageStatus.REPLIED),
        (ledger.acknowledged, MessageStatus.ACKNOWLEDGED),
    ]:
        if target in allowed:
            assert event(current) is target
        else:
            with pytest.raises(InvalidTransitionError):
                event(current)
    assert ledger.is_open(current) == (MessageStatus.REPLIED in allowed)


def _sent(*, created_at: float = 100.0, ttl: float = 50.0) -> Metadata:
    return Metadata(
        run_id=7,
        message_id="a" * 32,
        src_node_id=SERVER_NODE_ID,
        dst_node_id=42,
        group_id="g",
        created_at=created_at,
        ttl=ttl,
        message_type="train",
    )


@pytest.mark.parametrize(
    ("asked", "now", "expected"),
    [(500.0, 120.0, 30.0), (10.0, 120.0, 10.0), (500.0, 150.0, 500.0)],
)
def test_a_reply_never_outlives_its_message(asked: float, now: float, expected: float) -> None:
    """Bounded by what the message has left; a message with nothing left bounds nothing
    (it was answered when it expired)."""
    assert ledger.reply_ttl(asked, _sent(), now) == pytest.approx(expected)


def test_a_reply_is_stamped_from_the_message_it_answers() -> None:
    reply = Metadata(run_id=0, src_node_id=0, dst_node_id=0, ttl=500.0, message_type="train")
    ledger.stamp_reply(reply, _sent(), 120.0, "b" * 32)
    assert (reply.run_id, reply.src_node_id, reply.dst_node_id) == (7, 42, SERVER_NODE_ID)
    assert (reply.reply_to_message_id, reply.message_id) == ("a" * 32, "b" * 32)
    assert (reply.group_id, reply.message_type) == ("g", "train")
    assert (reply.created_at, reply.ttl) == (120.0, pytest.approx(30.0))


def test_fedcores_answer_is_stamped_as_a_nodes_reply() -> None:
    answer = ledger.answer_reply(_sent(), ledger.node_gone(42, ledger.NODE_SILENT), 120.0, "c" * 32)
    assert answer.error.code == ErrorCode.NODE_UNAVAILABLE
    assert answer.error.reason == f"{ledger.NODE_SILENT} (42)"
    meta = answer.metadata
    assert (meta.src_node_id, meta.dst_node_id, meta.message_id) == (42, SERVER_NODE_ID, "c" * 32)
    assert (meta.created_at, meta.expires_at) == (120.0, pytest.approx(150.0))
    expired = ledger.answer_reply(_sent(), ledger.expired(50.0), 150.0, "d" * 32)
    assert expired.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert "TTL of 50 s" in expired.error.reason
    assert expired.metadata.ttl == 50.0


def test_only_the_messages_node_may_answer_it_and_with_its_type() -> None:
    reply = Message(RecordDict(), reply_to=Message(RecordDict(), 42, "train"))
    reply.metadata.reply_to_message_id = "a" * 32
    assert ledger.check_reply(42, _sent(), reply).message_id == "a" * 32
    with pytest.raises(MessageNotFoundError):
        ledger.check_reply(43, _sent(), reply)
    with pytest.raises(MessageNotFoundError):
        ledger.check_reply(42, None, reply)
    reply.metadata.message_type = "evaluate"
    with pytest.raises(ReplyRejectedError):
        ledger.check_reply(42, _sent(), reply)


def test_a_second_reply_is_the_first_one_again_or_refused() -> None:
    assert ledger.repeated_reply("a" * 32, "b" * 32, None, same=True) == "b" * 32
    with pytest.raises(ConflictError):
        ledger.repeated_reply("a" * 32, "b" * 32, None, same=False)
    with pytest.raises(ReplyRejectedError, match="answered by fedcore: gone"):
        ledger.repeated_reply("a" * 32, "b" * 32, "gone", same=True)


def test_a_chosen_message_id_is_a_retry_in_its_run_and_taken_in_another() -> None:
    assert ledger.check_chosen_id(7, "a" * 32, None) is False
    assert ledger.check_chosen_id(7, "a" * 32, 7) is True
    with pytest.raises(ConflictError):
        ledger.check_chosen_id(7, "a" * 32, 8)
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        ledger.check_chosen_id(7, "A" * 32, None)


def test_a_message_to_a_node_not_online_is_answered_at_once() -> None:
    assert ledger.on_arrival(42, True) is None
    answer = ledger.on_arrival(42, False)
    assert answer is not None
    assert answer.code == ErrorCode.NODE_UNAVAILABLE
    assert ledger.silent_at(10.0, 3.0, 2.0) == 16.0
    assert ledger.silent_at(10.0, 3.0, math.inf) == math.inf
