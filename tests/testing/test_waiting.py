from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from fedcore.testing.waiting import wait_until


def _after(looks: int, value: object) -> Callable[[], object]:
    """A condition that is falsy for its first ``looks`` calls, then ``value``."""
    calls = iter(range(looks + 1))

    def condition() -> object:
        return value if next(calls) == looks else None

    return condition


def test_it_returns_the_first_truthy_value_the_condition_gives() -> None:
    assert wait_until(_after(3, ["found"]), 10, interval=0.001) == ["found"]


def test_a_condition_true_at_once_is_looked_at_once_and_never_slept_on() -> None:
    looks: list[float] = []
    started = time.monotonic()

    def condition() -> bool:
        looks.append(time.monotonic())
        return True

    assert wait_until(condition, 10, interval=60) is True
    assert len(looks) == 1
    assert time.monotonic() - started < 30  # not one 60 s interval


def test_past_the_deadline_it_raises_naming_what_it_waited_for() -> None:
    looks = 0

    def never() -> int:
        nonlocal looks
        looks += 1
        return 0

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^not within 0\.2 s: the marker file$"):
        wait_until(never, 0.2, "the marker file", interval=0.01)
    assert time.monotonic() - started >= 0.2
    assert looks >= 2  # it looked again before giving up, not only once at the start


def test_what_is_called_only_when_the_wait_fails_and_then_shows_its_state() -> None:
    log: list[str] = []

    def tail() -> str:
        log.append("asked")
        return "the log's last line"

    assert wait_until(_after(1, True), 10, tail, interval=0.001)
    assert log == []
    with pytest.raises(TimeoutError, match="the log's last line"):
        wait_until(lambda: False, 0.01, tail, interval=0.001)
    assert log == ["asked"]


def test_an_exception_from_the_condition_ends_the_wait_at_once() -> None:
    def finished_otherwise() -> bool:
        raise AssertionError("the run failed")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="the run failed"):
        wait_until(finished_otherwise, 60, interval=60)
    assert time.monotonic() - started < 30
