"""Backoff: ceilings grow to a cap, jitter is full and seeded, success resets; outages log once."""

from __future__ import annotations

import itertools
import logging
import random

import anyio
import pytest

from fedcore.errors import LinkBusyError, LinkUnavailableError
from fedcore.roles.node import Backoff, BackoffPolicy
from fedcore.roles.node.retry import Retrier
from fedcore.testing import FakeClock

pytestmark = pytest.mark.anyio

POLICY = BackoffPolicy(initial=1.0, maximum=10.0, factor=2.0)


class Ceiling(random.Random):
    """A Random whose ``uniform`` draws the top of its range: delays show the ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_ceilings_grow_geometrically_up_to_the_cap(fake_clock: FakeClock) -> None:
    backoff = Backoff(fake_clock, POLICY, Ceiling())
    assert [backoff.next_delay() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_success_resets_to_the_first_ceiling(fake_clock: FakeClock) -> None:
    backoff = Backoff(fake_clock, POLICY, Ceiling())
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]


def test_jitter_is_full_and_the_same_for_the_same_seed(fake_clock: FakeClock) -> None:
    def delays(seed: int) -> list[float]:
        backoff = Backoff(fake_clock, POLICY, random.Random(seed))
        return [backoff.next_delay() for _ in range(40)]

    first = delays(7)
    assert first == delays(7)
    assert first != delays(8)
    ceilings = [min(10.0, 2.0**n) for n in range(40)]
    assert all(0 <= delay <= ceiling for delay, ceiling in zip(first, ceilings, strict=True))
    # Full jitter: the capped delays spread over the whole range, not just near the cap.
    capped = first[4:]
    assert min(capped) < 3.0
    assert max(capped) > 7.0


async def test_wait_sleeps_the_delay_on_the_clock(fake_clock: FakeClock) -> None:
    backoff = Backoff(fake_clock, POLICY, Ceiling())
    done = anyio.Event()

    async def wait_twice() -> None:
        await backoff.wait()
        await backoff.wait()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_twice)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(0.9)
        await anyio.wait_all_tasks_blocked()
        assert fake_clock.pending_timers == 1
        fake_clock.advance(0.1)  # the first wait (1 s) ends; the second (2 s) starts
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(1.9)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        fake_clock.advance(0.1)
        await anyio.wait_all_tasks_blocked()
        assert done.is_set()


@pytest.mark.parametrize(
    ("initial", "maximum", "factor"),
    [(0.0, 1.0, 2.0), (1.0, 0.5, 2.0), (1.0, 2.0, 0.5), (1.0, float("inf"), 2.0)],
)
def test_a_policy_out_of_range_is_refused(initial: float, maximum: float, factor: float) -> None:
    with pytest.raises(ValueError, match="BackoffPolicy"):
        BackoffPolicy(initial, maximum, factor)


async def test_the_retrier_retries_until_the_link_answers_and_logs_the_outage_once(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    retry = Retrier(fake_clock, POLICY, seed=3)
    attempts: list[float] = []

    async def flaky() -> str:
        attempts.append(fake_clock.now())
        if len(attempts) <= 4:
            raise LinkUnavailableError("the link at 127.0.0.1:9 is unavailable")
        return "answer"

    result: list[str] = []

    async def call() -> None:
        result.append(await retry(flaky))

    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        while not result:
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(0.05)
    assert result == ["answer"]
    assert len(attempts) == 5
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert all(0 <= gap <= min(10.0, 2.0**n) + 0.05 for n, gap in enumerate(gaps))
    messages = [record.getMessage() for record in caplog.records]
    assert sum("unavailable" in message for message in messages) == 1
    assert sum("the link is back" in message for message in messages) == 1


async def test_the_retrier_does_not_retry_other_errors(fake_clock: FakeClock) -> None:
    retry = Retrier(fake_clock, POLICY, seed=0)
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("final")

    with pytest.raises(ValueError, match="final"):
        await retry(refused)
    assert calls == 1


async def test_the_retrier_backs_off_while_the_link_is_busy_and_logs_the_episode_once(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """RESOURCE_EXHAUSTED is retried like an outage, and three calls refused at once log once."""
    retry = Retrier(fake_clock, POLICY, seed=5)
    attempts: list[float] = []

    async def rate_limited() -> str:
        attempts.append(fake_clock.now())
        if len(attempts) <= 12:
            raise LinkBusyError("the link refused the call (RESOURCE_EXHAUSTED): too many")
        return "answer"

    results: list[str] = []

    async def call() -> None:
        results.append(await retry(rate_limited))

    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)
        while len(results) < 3:
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(0.05)
    assert results == ["answer"] * 3
    assert len(attempts) == 15
    assert fake_clock.now() > 1.0  # the refusals were waited out, not retried at once
    messages = [record.getMessage() for record in caplog.records]
    assert sum("RESOURCE_EXHAUSTED" in message for message in messages) == 1
    assert sum("the link is back" in message for message in messages) == 1


async def test_the_retrier_waits_at_least_what_the_busy_link_asked(fake_clock: FakeClock) -> None:
    retry = Retrier(fake_clock, BackoffPolicy(initial=0.1, maximum=0.1, factor=1.0), seed=1)
    attempts: list[float] = []

    async def asks_for_seven_seconds() -> str:
        attempts.append(fake_clock.now())
        if len(attempts) == 1:
            raise LinkBusyError("too many requests", retry_after=7.0)
        return "answer"

    results: list[str] = []

    async def call() -> None:
        results.append(await retry(asks_for_seven_seconds))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        while not results:
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(0.05)
    assert 7.0 <= attempts[1] - attempts[0] <= 7.0 + 0.1 + 0.05
