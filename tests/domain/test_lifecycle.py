"""Walk both transition tables whole: every listed move works, every other one raises."""

from __future__ import annotations

import itertools

import pytest

from fedcore.domain.lifecycle import (
    MESSAGE_TRANSITIONS,
    RUN_TRANSITIONS,
    MessageStatus,
    RunStatus,
    transition,
)
from fedcore.errors import InvalidTransitionError


@pytest.mark.parametrize(("current", "new"), list(itertools.product(RunStatus, RunStatus)))
def test_run_table(current: RunStatus, new: RunStatus) -> None:
    if new in RUN_TRANSITIONS[current]:
        assert transition(current, new) is new
    else:
        with pytest.raises(InvalidTransitionError, match=f"from {current} to {new}"):
            transition(current, new)


@pytest.mark.parametrize(("current", "new"), list(itertools.product(MessageStatus, MessageStatus)))
def test_message_table(current: MessageStatus, new: MessageStatus) -> None:
    if new in MESSAGE_TRANSITIONS[current]:
        assert transition(current, new) is new
    else:
        with pytest.raises(InvalidTransitionError):
            transition(current, new)


def test_finished_statuses_are_final_and_reachable() -> None:
    finished = {status for status in RunStatus if status.finished}
    assert finished == {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED}
    assert all(not RUN_TRANSITIONS[status] for status in finished)
    assert str(RunStatus.COMPLETED) == "finished:completed"
    reachable = set().union(*RUN_TRANSITIONS.values())
    assert reachable == set(RunStatus)
    # Back to pending only from starting: a claim ran out before its exec launched the run.
    assert [s for s, moves in RUN_TRANSITIONS.items() if RunStatus.PENDING in moves] == [
        RunStatus.STARTING
    ]
