"""The link's exec API over a LinkState: claims by event, fencing, and waiting for a run's end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from fedcore.domain import Run, RunStatus
from fedcore.errors import ClaimLostError, NotFoundError, RunNotFoundError
from fedcore.roles.link.exec import LinkExec
from fedcore.state.base import RunClaim
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock

pytestmark = pytest.mark.anyio

RUNTIME = "127.0.0.1:4242"


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


@pytest.fixture
def service(state: InMemoryLinkState, fake_clock: FakeClock) -> LinkExec:
    return LinkExec(state, fake_clock, runtime_address=RUNTIME)


async def _run(state: InMemoryLinkState, bundle: bytes = b"bundle") -> Run:
    return await state.create_run({"k": 1}, bundle_hash=await state.put_bundle(bundle))


async def test_a_claim_waits_for_a_run_and_is_woken_by_its_creation(
    service: LinkExec, state: InMemoryLinkState
) -> None:
    assert await service.claim_runs(limit=2, lease=5.0) == []
    claims: list[RunClaim] = []

    async def claim() -> None:
        claims.extend(await service.claim_runs(limit=2, lease=5.0, wait_seconds=60))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(claim)
        await anyio.wait_all_tasks_blocked()
        assert claims == []
        run = await _run(state)  # no time passes: the creation itself wakes the claim
    (claimed,) = claims
    assert claimed.run.run_id == run.run_id
    assert claimed.attempt == 1
    assert (await state.get_run(run.run_id)).status is RunStatus.STARTING


async def test_a_claim_wait_ends_on_the_clock_with_nothing(
    service: LinkExec, fake_clock: FakeClock
) -> None:
    claims: list[list[RunClaim]] = []

    async def claim() -> None:
        claims.append(await service.claim_runs(limit=1, lease=5.0, wait_seconds=30))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(claim)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(29)
        await anyio.wait_all_tasks_blocked()
        assert claims == []
        fake_clock.advance(1)
    assert claims == [[]]


async def test_a_run_is_claimed_by_exactly_one_of_many_waiting_execs(
    service: LinkExec, state: InMemoryLinkState
) -> None:
    claims: list[RunClaim] = []

    async def claim() -> None:
        claims.extend(await service.claim_runs(limit=1, lease=5.0, wait_seconds=60))

    async with anyio.create_task_group() as tasks:
        for _ in range(5):
            tasks.start_soon(claim)
        await anyio.wait_all_tasks_blocked()
        await _run(state)
        await anyio.wait_all_tasks_blocked()
        assert len(claims) == 1
        tasks.cancel_scope.cancel()


async def test_a_stale_claimants_token_is_refused_and_changes_nothing(
    service: LinkExec, state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    run = await _run(state)
    (stale,) = await service.claim_runs(limit=1, lease=5.0)
    fake_clock.advance(5.1)  # the first exec died: its claim runs out, the run is pending again
    assert (await service.get_run(run.run_id)).status is RunStatus.PENDING
    (fresh,) = await service.claim_runs(limit=1, lease=5.0)
    assert fresh.token > stale.token
    assert fresh.attempt == 2
    assert fresh.secret != stale.secret
    with pytest.raises(ClaimLostError):
        await service.renew_claim(run.run_id, stale.token, lease=5.0)
    with pytest.raises(ClaimLostError):
        await service.start_run(run.run_id, stale.token, heartbeat_interval=1.0)
    with pytest.raises(ClaimLostError):
        await service.fail_run(run.run_id, stale.token, "stale")
    assert (await service.get_run(run.run_id)).status is RunStatus.STARTING
    started = await service.start_run(run.run_id, fresh.token, heartbeat_interval=1.0)
    assert started.status is RunStatus.RUNNING
    again = await service.start_run(run.run_id, fresh.token, heartbeat_interval=1.0)
    assert again.status is RunStatus.RUNNING  # a retry after a lost answer
    assert await service.renew_claim(run.run_id, fresh.token, lease=5.0) == fake_clock.now() + 5


async def test_a_finished_run_refuses_the_renewal_and_ends_the_wait_for_it(
    service: LinkExec, state: InMemoryLinkState
) -> None:
    run = await _run(state)
    (claim,) = await service.claim_runs(limit=1, lease=5.0)
    await service.start_run(run.run_id, claim.token, heartbeat_interval=100.0)
    ended: list[Run] = []

    async def wait() -> None:
        ended.append(await service.wait_finished(run.run_id, wait_seconds=60))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        await state.append_logs(run.run_id, ["a change that is not the end"])
        await _run(state)  # another run's news does not end this wait
        await anyio.wait_all_tasks_blocked()
        assert ended == []
        await state.update_run_status(run.run_id, RunStatus.STOPPED, "operator")
    assert [(r.status, r.reason) for r in ended] == [(RunStatus.STOPPED, "operator")]
    with pytest.raises(ClaimLostError):
        await service.renew_claim(run.run_id, claim.token, lease=5.0)


async def test_a_wait_for_the_end_returns_the_run_as_it_is_when_time_is_up(
    service: LinkExec, state: InMemoryLinkState, fake_clock: FakeClock
) -> None:
    run = await _run(state)
    await service.claim_runs(limit=1, lease=5.0)
    assert (await service.wait_finished(run.run_id, wait_seconds=0)).status is RunStatus.STARTING
    ended: list[Run] = []

    async def wait() -> None:
        ended.append(await service.wait_finished(run.run_id, wait_seconds=3))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(3)
    assert [r.status for r in ended] == [RunStatus.STARTING]
    with pytest.raises(ValueError, match="negative"):
        await service.wait_finished(run.run_id, wait_seconds=-1)


async def test_the_claimant_fails_its_run_and_reports_in_its_log(
    service: LinkExec, state: InMemoryLinkState
) -> None:
    run = await _run(state, b"the app")
    (claim,) = await service.claim_runs(limit=1, lease=5.0)
    assert await service.runtime_address() == RUNTIME
    assert await service.get_bundle(run.bundle_hash) == b"the app"
    await service.append_logs(run.run_id, ["[exec] it died"])
    failed = await service.fail_run(run.run_id, claim.token, "the ServerApp process died")
    assert (failed.status, failed.reason) == (RunStatus.FAILED, "the ServerApp process died")
    assert [line.text for line in await state.get_logs(run.run_id)] == ["[exec] it died"]
    with pytest.raises(ClaimLostError):  # finished: the claim is over
        await service.fail_run(run.run_id, claim.token, "again")
    with pytest.raises(NotFoundError):
        await service.get_bundle("0" * 64)
    with pytest.raises(RunNotFoundError):
        await service.get_run(run.run_id + 1)
