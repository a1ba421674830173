"""The LinkState conformance suite for deployment: runs, claims, bundles, contexts, logs.

The contract of :class:`~fedcore.state.base.RunState`, next to
:mod:`fedcore.testing.linkstate` (nodes, messages, replies): a LinkState must pass
both. Subclass :class:`RunStateConformance` and provide the same ``state`` fixture as
for :class:`~fedcore.testing.linkstate.LinkStateConformance` — a new, entered
LinkState on the ``fake_clock`` fixture with heartbeat patience
:data:`~fedcore.testing.linkstate.PATIENCE`::

    class TestMyRunState(RunStateConformance):
        @pytest.fixture
        async def state(self, fake_clock):
            async with MyLinkState(fake_clock, heartbeat_patience=PATIENCE) as state:
                yield state

What it checks: runs listed oldest first with their creation time and bundle; bundles
stored once by hash; contexts saved and replaced per node; logs numbered from 1, paged
and announced; and the exec's claims (R5, R6: docs/reliability.md) — exclusive, oldest first,
fenced by strictly increasing tokens, sent back to ``pending`` when they run out (at
most :data:`~fedcore.state.ledger.MAX_CLAIM_ATTEMPTS` times, then ``finished:failed``),
and a running run failed once its ServerApp misses ``patience × interval`` of
heartbeats, not before. Also ``renew_leases``, the node's side of long messages.
"""

from __future__ import annotations

import hashlib
import math

import anyio
import pytest

from fedcore.domain import SERVER_NODE_ID, ConfigRecord, RecordDict, Run, RunStatus
from fedcore.errors import (
    ClaimLostError,
    InvalidTransitionError,
    NodeNotFoundError,
    NotFoundError,
    RunFinishedError,
    RunNotFoundError,
)
from fedcore.state.base import LinkState, RunClaim
from fedcore.state.ledger import MAX_CLAIM_ATTEMPTS
from fedcore.testing.clock import FakeClock
from fedcore.testing.linkstate import (
    EPSILON,
    INTERVAL,
    LEASE,
    MESSAGE_UNAVAILABLE,
    PATIENCE,
    UNKNOWN_MESSAGE_ID,
    UNKNOWN_NODE_ID,
    UNKNOWN_RUN_ID,
    Recorder,
    advance,
    error_code,
    pull_one,
    push,
    reply,
    rich_records,
    the_reply,
)

__all__ = ["RunStateConformance"]

CLAIM = 5.0
"""The lease of the claims the tests make."""
SILENT_AFTER = PATIENCE * INTERVAL
"""How long a running run's ServerApp, heartbeating every ``INTERVAL``, may stay silent."""
BUNDLE = b"PK\x03\x04 not really a zip, but bytes all the same \x00\xff"


async def claim_one(state: LinkState, *, lease: float = CLAIM) -> RunClaim:
    (claim,) = await state.claim_runs(limit=1, lease=lease)
    return claim


async def running(state: LinkState, *, heartbeat_interval: float = INTERVAL) -> RunClaim:
    """Create a run, claim it and start it; return its claim.

    The claim is shorter than the ServerApp's heartbeat deadline, so that the vouching
    of starting it (see ``start_run``) ends first and the heartbeats alone count.
    """
    await state.create_run({})
    claim = await claim_one(state, lease=SILENT_AFTER / 2)
    await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=heartbeat_interval)
    return claim


async def status(state: LinkState, run_id: int) -> RunStatus:
    return (await state.get_run(run_id)).status


def state_of(n: int) -> RecordDict:
    return RecordDict({"config": ConfigRecord({"n": n})})


class RunStateConformance:
    """The tests every LinkState must pass; a subclass provides the ``state`` fixture."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def state(self) -> LinkState:
        raise NotImplementedError(
            "a RunStateConformance subclass must provide the `state` fixture: an entered "
            "LinkState on the `fake_clock` fixture with heartbeat patience PATIENCE"
        )

    @pytest.fixture
    async def run_id(self, state: LinkState) -> int:
        return (await state.create_run({})).run_id

    @pytest.fixture
    async def steady_node(self, state: LinkState) -> int:
        """A node that never goes offline, so that only leases and TTLs move its messages."""
        return await state.create_node(heartbeat_interval=math.inf)

    # Renewing leases -----------------------------------------------------------------

    async def test_a_renewed_lease_outlives_its_first_deadline(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, steady_node: int
    ) -> None:
        message_id = await push(state, run_id, steady_node)
        await pull_one(state, steady_node, lease=LEASE)
        await advance(fake_clock, LEASE - EPSILON)
        assert await state.renew_leases(steady_node, [message_id], lease=LEASE) == []
        await advance(fake_clock, 2 * EPSILON)
        assert await state.pull_messages(steady_node) == [], "redelivered despite the renewal"
        await advance(fake_clock, LEASE - 3 * EPSILON)
        assert await state.pull_messages(steady_node) == []
        await advance(fake_clock, 2 * EPSILON)
        again = await pull_one(state, steady_node)
        assert again.metadata.message_id == message_id, "a renewed lease never ran out"

    async def test_renewing_a_lease_taken_until_the_ttl_makes_it_a_timed_one(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, steady_node: int
    ) -> None:
        message_id = await push(state, run_id, steady_node)
        await pull_one(state, steady_node, lease=None)
        assert await state.renew_leases(steady_node, [message_id], lease=LEASE) == []
        await advance(fake_clock, LEASE + EPSILON)
        assert (await pull_one(state, steady_node)).metadata.message_id == message_id

    async def test_renew_leases_returns_what_it_did_not_extend_in_order(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, steady_node: int
    ) -> None:
        """Expired, answered, another node's, a finished run's and unknown ids come back."""
        other_node = await state.create_node(heartbeat_interval=math.inf)
        other_run = (await state.create_run({})).run_id
        long_lease = 10 * LEASE
        answered = await push(state, run_id, steady_node)
        await state.push_reply(steady_node, reply(await pull_one(state, steady_node)))
        held = await push(state, run_id, steady_node)
        await pull_one(state, steady_node, lease=long_lease)
        theirs = await push(state, run_id, other_node)
        await pull_one(state, other_node, lease=long_lease)
        finished = await push(state, other_run, steady_node)
        await pull_one(state, steady_node, lease=long_lease)
        await state.update_run_status(other_run, RunStatus.STOPPED)
        lapsed = await push(state, run_id, steady_node)
        await pull_one(state, steady_node, lease=LEASE)
        await advance(fake_clock, LEASE + EPSILON)
        asked = [UNKNOWN_MESSAGE_ID, held, finished, answered, theirs, lapsed]
        refused = await state.renew_leases(steady_node, asked, lease=LEASE)
        assert refused == [UNKNOWN_MESSAGE_ID, finished, answered, theirs, lapsed]

    async def test_renew_leases_of_an_unknown_node_is_refused(self, state: LinkState) -> None:
        with pytest.raises(NodeNotFoundError):
            await state.renew_leases(UNKNOWN_NODE_ID, [UNKNOWN_MESSAGE_ID], lease=LEASE)

    @pytest.mark.parametrize("lease", [0.0, -1.0, math.nan])
    async def test_renew_leases_refuses_a_bad_lease(
        self, state: LinkState, steady_node: int, lease: float
    ) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.renew_leases(steady_node, [], lease=lease)

    # Runs --------------------------------------------------------------------------

    async def test_runs_are_listed_oldest_first_with_their_creation_time(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        assert await state.list_runs() == []
        created: list[Run] = []
        for _ in range(3):
            created.append(await state.create_run({"k": len(created)}))
            await advance(fake_clock, 1.0)
        await state.update_run_status(created[1].run_id, RunStatus.STOPPED)
        listed = await state.list_runs()
        assert [run.run_id for run in listed] == [run.run_id for run in created]
        start = created[0].created_at
        assert [run.created_at for run in listed] == [start, start + 1.0, start + 2.0]
        assert start == fake_clock.now() - 3.0
        assert [run.status for run in listed] == [
            RunStatus.PENDING,
            RunStatus.STOPPED,
            RunStatus.PENDING,
        ]
        assert [run.run_config for run in listed] == [{"k": 0}, {"k": 1}, {"k": 2}]

    async def test_runs_created_at_one_instant_keep_their_order(self, state: LinkState) -> None:
        run_ids = [(await state.create_run({})).run_id for _ in range(12)]
        assert [run.run_id for run in await state.list_runs()] == run_ids

    async def test_a_run_keeps_its_bundle_hash(self, state: LinkState) -> None:
        bundle_hash = await state.put_bundle(BUNDLE)
        created = await state.create_run({}, bundle_hash=bundle_hash)
        assert created.bundle_hash == bundle_hash
        assert (await state.get_run(created.run_id)).bundle_hash == bundle_hash
        assert (await state.create_run({})).bundle_hash == ""

    async def test_a_run_with_an_unknown_bundle_is_refused(self, state: LinkState) -> None:
        with pytest.raises(NotFoundError):
            await state.create_run({}, bundle_hash=hashlib.sha256(b"never stored").hexdigest())
        assert await state.list_runs() == []

    # Bundles -----------------------------------------------------------------------

    async def test_a_bundle_is_stored_under_its_sha256(self, state: LinkState) -> None:
        bundle_hash = await state.put_bundle(BUNDLE)
        assert bundle_hash == hashlib.sha256(BUNDLE).hexdigest()
        assert await state.get_bundle(bundle_hash) == BUNDLE

    async def test_putting_a_bundle_again_is_idempotent(self, state: LinkState) -> None:
        first = await state.put_bundle(BUNDLE)
        other = await state.put_bundle(BUNDLE + b"!")
        assert await state.put_bundle(BUNDLE) == first
        assert other != first
        assert await state.get_bundle(first) == BUNDLE
        assert await state.get_bundle(other) == BUNDLE + b"!"

    async def test_an_unknown_bundle_is_not_found(self, state: LinkState) -> None:
        await state.put_bundle(BUNDLE)
        with pytest.raises(NotFoundError):
            await state.get_bundle(hashlib.sha256(b"never stored").hexdigest())
        with pytest.raises(NotFoundError):
            await state.get_bundle("not even a hash")

    # Contexts ----------------------------------------------------------------------

    async def test_a_saved_context_loads_back(self, state: LinkState, run_id: int) -> None:
        await state.save_context(run_id, SERVER_NODE_ID, rich_records())
        await state.save_context(run_id, 7, state_of(7))
        assert await state.load_context(run_id, SERVER_NODE_ID) == rich_records()
        assert await state.load_context(run_id, 7) == state_of(7)

    async def test_saving_a_context_replaces_the_last_one(
        self, state: LinkState, run_id: int
    ) -> None:
        await state.save_context(run_id, 7, rich_records())
        await state.save_context(run_id, 7, state_of(2))
        assert await state.load_context(run_id, 7) == state_of(2)

    async def test_a_context_never_saved_is_empty(self, state: LinkState, run_id: int) -> None:
        other_run = (await state.create_run({})).run_id
        await state.save_context(other_run, 7, state_of(1))
        assert await state.load_context(run_id, 7) == RecordDict()
        assert await state.load_context(other_run, 8) == RecordDict()

    async def test_a_saved_context_is_a_copy(self, state: LinkState, run_id: int) -> None:
        saved = state_of(1)
        await state.save_context(run_id, 7, saved)
        saved.config_records["config"]["n"] = 2
        assert await state.load_context(run_id, 7) == state_of(1)

    async def test_a_context_outlives_its_run(self, state: LinkState, run_id: int) -> None:
        await state.save_context(run_id, 7, state_of(1))
        await state.update_run_status(run_id, RunStatus.FAILED)
        assert await state.load_context(run_id, 7) == state_of(1)
        await state.save_context(run_id, 7, state_of(2))
        assert await state.load_context(run_id, 7) == state_of(2)

    async def test_contexts_of_an_unknown_run_are_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.save_context(UNKNOWN_RUN_ID, 7, state_of(1))
        with pytest.raises(RunNotFoundError):
            await state.load_context(UNKNOWN_RUN_ID, 7)

    # Logs --------------------------------------------------------------------------

    async def test_log_lines_are_numbered_from_one_and_stamped(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        assert await state.append_logs(run_id, ["a", "b"]) == 2
        await advance(fake_clock, 1.5)
        assert await state.append_logs(run_id, ["c"]) == 3
        assert await state.append_logs(run_id, []) == 3
        lines = await state.get_logs(run_id)
        assert [(line.seq, line.text) for line in lines] == [(1, "a"), (2, "b"), (3, "c")]
        now = fake_clock.now()
        assert [line.time for line in lines] == [now - 1.5, now - 1.5, now]

    async def test_get_logs_pages_with_after_and_limit(self, state: LinkState, run_id: int) -> None:
        await state.append_logs(run_id, [f"line {n}" for n in range(1, 11)])
        assert [line.seq for line in await state.get_logs(run_id, after=7)] == [8, 9, 10]
        assert [line.seq for line in await state.get_logs(run_id, after=2, limit=3)] == [3, 4, 5]
        assert await state.get_logs(run_id, after=10) == []
        assert await state.get_logs(run_id, limit=0) == []
        assert [line.text for line in await state.get_logs(run_id, limit=1)] == ["line 1"]
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.get_logs(run_id, limit=-1)

    async def test_logs_are_kept_per_run(self, state: LinkState, run_id: int) -> None:
        other_run = (await state.create_run({})).run_id
        await state.append_logs(run_id, ["mine"])
        assert await state.append_logs(other_run, ["theirs", "too"]) == 2
        assert [line.text for line in await state.get_logs(run_id)] == ["mine"]
        assert await state.get_logs((await state.create_run({})).run_id) == []

    async def test_a_finished_run_still_takes_log_lines(
        self, state: LinkState, run_id: int
    ) -> None:
        await state.append_logs(run_id, ["working"])
        await state.update_run_status(run_id, RunStatus.STOPPED)
        assert await state.append_logs(run_id, ["last words"]) == 2
        assert [line.text for line in await state.get_logs(run_id)] == ["working", "last words"]

    async def test_a_named_append_sent_again_appends_nothing(
        self, state: LinkState, run_id: int
    ) -> None:
        assert await state.append_logs(run_id, ["a", "b"], batch="app-1") == 2
        assert await state.append_logs(run_id, ["a", "b"], batch="app-1") == 2  # a retry
        assert await state.append_logs(run_id, ["exec line"]) == 3  # unnamed: always appended
        assert await state.append_logs(run_id, ["c"], batch="app-2") == 4
        assert await state.append_logs(run_id, ["c"], batch="app-2") == 4
        assert await state.append_logs(run_id, ["a"], batch="app-1") == 5  # not the last name
        texts = [line.text for line in await state.get_logs(run_id)]
        assert texts == ["a", "b", "exec line", "c", "a"]

    async def test_logs_of_an_unknown_run_are_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.append_logs(UNKNOWN_RUN_ID, ["x"])
        with pytest.raises(RunNotFoundError):
            await state.get_logs(UNKNOWN_RUN_ID)

    async def test_watch_logs_hears_the_last_number_of_each_append_of_its_run(
        self, state: LinkState, run_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        heard = Recorder[int]()
        with state.watch_logs(run_id, heard):
            await state.append_logs(other_run, ["x", "y", "z", "w", "v"])
            await state.append_logs(run_id, ["a", "b"])
            await state.append_logs(run_id, [])
            await state.append_logs(run_id, ["c"])
            await heard.wait_for(3)
        await state.append_logs(run_id, ["after closing"])
        assert heard.calls == [2, 3]

    # Claims ------------------------------------------------------------------------

    async def test_a_claim_takes_the_oldest_pending_runs(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        run_ids = [(await state.create_run({"i": i})).run_id for i in range(3)]
        claims = await state.claim_runs(limit=2, lease=CLAIM)
        assert [claim.run.run_id for claim in claims] == run_ids[:2]
        for claim in claims:
            assert claim.run.status is RunStatus.STARTING
            assert claim.attempt == 1
            assert claim.expires_at == fake_clock.now() + CLAIM
            assert claim.secret
            assert await status(state, claim.run.run_id) is RunStatus.STARTING
        assert claims[0].secret != claims[1].secret
        (last,) = await state.claim_runs(limit=5, lease=CLAIM)
        assert last.run.run_id == run_ids[2]
        assert last.run.run_config == {"i": 2}
        assert await state.claim_runs(limit=5, lease=CLAIM) == []

    async def test_only_pending_runs_are_claimed(self, state: LinkState) -> None:
        stopped = (await state.create_run({})).run_id
        await state.update_run_status(stopped, RunStatus.STOPPED)
        starting = (await state.create_run({})).run_id
        await state.update_run_status(starting, RunStatus.STARTING)
        pending = (await state.create_run({})).run_id
        assert [c.run.run_id for c in await state.claim_runs(limit=5, lease=CLAIM)] == [pending]

    async def test_claim_runs_checks_its_arguments(self, state: LinkState, run_id: int) -> None:
        assert await state.claim_runs(limit=0, lease=CLAIM) == []
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.claim_runs(limit=-1, lease=CLAIM)
        for lease in (0.0, -1.0, math.nan):
            with pytest.raises(ValueError):  # noqa: PT011
                await state.claim_runs(limit=1, lease=lease)
        assert await status(state, run_id) is RunStatus.PENDING

    async def test_concurrent_claims_never_share_a_run(self, state: LinkState) -> None:
        run_ids = {(await state.create_run({})).run_id for _ in range(8)}
        claimed: list[list[RunClaim]] = []

        async def claim() -> None:
            claimed.append(await state.claim_runs(limit=3, lease=CLAIM))

        async with anyio.create_task_group() as task_group:
            for _ in range(4):
                task_group.start_soon(claim)
        got = [claim.run.run_id for claims in claimed for claim in claims]
        assert len(got) == len(set(got)) == len(run_ids)
        assert set(got) == run_ids

    async def test_fencing_tokens_strictly_increase(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        for _ in range(3):
            await state.create_run({})
        tokens = [claim.token for claim in await state.claim_runs(limit=2, lease=CLAIM)]
        await advance(fake_clock, CLAIM + EPSILON)  # both run out: pending again
        await state.create_run({})
        tokens += [claim.token for claim in await state.claim_runs(limit=4, lease=CLAIM)]
        assert len(tokens) == 6
        assert tokens == sorted(set(tokens)), f"tokens do not strictly increase: {tokens}"

    async def test_renewing_a_claim_extends_it(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        claim = await claim_one(state)
        await advance(fake_clock, CLAIM - EPSILON)
        expires_at = await state.renew_claim(run_id, claim.token, lease=CLAIM)
        assert expires_at == fake_clock.now() + CLAIM
        await advance(fake_clock, 2 * EPSILON)
        assert await status(state, run_id) is RunStatus.STARTING
        await advance(fake_clock, CLAIM - 3 * EPSILON)
        assert await status(state, run_id) is RunStatus.STARTING
        await advance(fake_clock, 2 * EPSILON)
        assert await status(state, run_id) is RunStatus.PENDING

    async def test_a_claim_that_runs_out_sends_its_run_back_to_pending(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        first = await claim_one(state)
        heard = Recorder[int]()
        with state.watch_runs(heard):
            fake_clock.advance(CLAIM + EPSILON)
            await heard.wait_for(run_id)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.PENDING
        assert run.reason, "no reason given for going back to pending"
        second = await claim_one(state)
        assert second.run.run_id == run_id
        assert second.attempt == 2
        assert second.token > first.token

    async def test_the_last_claim_running_out_fails_the_run(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        for attempt in range(1, MAX_CLAIM_ATTEMPTS + 1):
            claim = await claim_one(state)
            assert claim.attempt == attempt
            await advance(fake_clock, CLAIM + EPSILON)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.FAILED
        assert run.reason, "no reason given for failing the run"
        assert await state.claim_runs(limit=1, lease=CLAIM) == []

    async def test_a_stale_token_is_refused_everywhere(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        stale = await claim_one(state)
        await advance(fake_clock, CLAIM + EPSILON)
        with pytest.raises(ClaimLostError):  # ran out, nobody claimed it since
            await state.renew_claim(run_id, stale.token, lease=CLAIM)
        current = await claim_one(state)
        with pytest.raises(ClaimLostError):
            await state.renew_claim(run_id, stale.token, lease=CLAIM)
        with pytest.raises(ClaimLostError):
            await state.start_run(run_id, stale.token, heartbeat_interval=INTERVAL)
        with pytest.raises(ClaimLostError):
            await state.update_run_status(run_id, RunStatus.FAILED, "late", token=stale.token)
        run = await state.get_run(run_id)
        assert (run.status, run.reason) == (RunStatus.STARTING, "")
        started = await state.start_run(run_id, current.token, heartbeat_interval=INTERVAL)
        assert started.status is RunStatus.RUNNING

    async def test_a_token_of_another_run_is_stale(self, state: LinkState) -> None:
        for _ in range(2):
            await state.create_run({})
        mine, theirs = await state.claim_runs(limit=2, lease=CLAIM)
        with pytest.raises(ClaimLostError):
            await state.start_run(mine.run.run_id, theirs.token, heartbeat_interval=INTERVAL)
        assert await status(state, mine.run.run_id) is RunStatus.STARTING

    async def test_claim_calls_on_an_unknown_run_are_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.renew_claim(UNKNOWN_RUN_ID, 1, lease=CLAIM)
        with pytest.raises(RunNotFoundError):
            await state.start_run(UNKNOWN_RUN_ID, 1, heartbeat_interval=INTERVAL)
        with pytest.raises(RunNotFoundError):
            await state.heartbeat_run(UNKNOWN_RUN_ID, heartbeat_interval=INTERVAL)

    async def test_the_claimant_reports_the_end_with_its_token(
        self, state: LinkState, run_id: int
    ) -> None:
        claim = await claim_one(state)
        failed = await state.update_run_status(
            run_id, RunStatus.FAILED, "launch failed", token=claim.token
        )
        assert (failed.status, failed.reason) == (RunStatus.FAILED, "launch failed")
        with pytest.raises(ClaimLostError):  # finishing ended the claim
            await state.renew_claim(run_id, claim.token, lease=CLAIM)

    async def test_finishing_a_run_ends_its_claim(self, state: LinkState) -> None:
        claim = await running(state)
        run_id = claim.run.run_id
        await state.update_run_status(run_id, RunStatus.STOPPED, "stopped by the operator")
        with pytest.raises(ClaimLostError):
            await state.renew_claim(run_id, claim.token, lease=CLAIM)
        with pytest.raises(ClaimLostError):
            await state.update_run_status(run_id, RunStatus.FAILED, token=claim.token)
        assert (await state.get_run(run_id)).reason == "stopped by the operator"

    async def test_moving_a_run_back_to_pending_ends_its_claim(
        self, state: LinkState, run_id: int
    ) -> None:
        claim = await claim_one(state)
        await state.update_run_status(run_id, RunStatus.PENDING, "the exec gave it back")
        with pytest.raises(ClaimLostError):
            await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
        with pytest.raises(RunNotFoundError):
            await state.check_run_secret(run_id, claim.secret)
        assert (await claim_one(state)).token > claim.token

    # Starting and heartbeating ---------------------------------------------------------

    async def test_a_started_run_ignores_its_claim_running_out(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        claim = await claim_one(state, lease=1.0)
        started = await state.start_run(run_id, claim.token, heartbeat_interval=100.0)
        assert started.status is RunStatus.RUNNING
        await advance(fake_clock, 10.0)
        assert await status(state, run_id) is RunStatus.RUNNING

    async def test_start_run_again_with_the_same_token_changes_nothing(
        self, state: LinkState, run_id: int
    ) -> None:
        claim = await claim_one(state)
        await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
        heard = Recorder[int]()
        with state.watch_runs(heard):
            again = await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
        assert again.status is RunStatus.RUNNING
        assert heard.calls == []

    async def test_start_run_refuses_a_bad_interval(self, state: LinkState, run_id: int) -> None:
        claim = await claim_one(state)
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.start_run(run_id, claim.token, heartbeat_interval=0.0)
        assert await status(state, run_id) is RunStatus.STARTING

    async def test_heartbeats_keep_a_run_alive(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        run_id = (await running(state)).run.run_id
        for _ in range(10):
            await advance(fake_clock, INTERVAL)
            assert (await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)).run_id == run_id
        await advance(fake_clock, SILENT_AFTER - EPSILON)
        assert await status(state, run_id) is RunStatus.RUNNING

    async def test_a_silent_server_app_fails_its_run_in_time_and_not_before(
        self, state: LinkState, fake_clock: FakeClock, steady_node: int
    ) -> None:
        run_id = (await running(state)).run.run_id
        await push(state, run_id, steady_node)
        await advance(fake_clock, SILENT_AFTER - EPSILON)
        assert await status(state, run_id) is RunStatus.RUNNING
        heard = Recorder[int]()
        with state.watch_runs(heard):
            fake_clock.advance(2 * EPSILON)
            await heard.wait_for(run_id)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.FAILED
        assert run.reason, "no reason given for failing the run"
        assert await state.pull_messages(steady_node) == [], "a failed run's message was kept"

    async def test_the_execs_renewals_vouch_for_a_silent_server_app(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        # The exec renews its claim only while the ServerApp's process lives: an app
        # whose own code holds its heartbeats back (a slow import) is alive all the same.
        claim = await running(state)
        run_id = claim.run.run_id
        for _ in range(10):
            await advance(fake_clock, CLAIM / 3)
            await state.renew_claim(run_id, claim.token, lease=CLAIM)
        assert await status(state, run_id) is RunStatus.RUNNING
        await advance(fake_clock, CLAIM - EPSILON)
        assert await status(state, run_id) is RunStatus.RUNNING
        await advance(fake_clock, 2 * EPSILON)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.FAILED, "nobody vouched for the run, yet it runs on"
        assert "no exec vouched" in run.reason

    async def test_starting_a_run_vouches_for_it_until_its_claim_runs_out(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        # The exec's next renewal is due before its claim runs out, however long after
        # the ServerApp's first heartbeat deadline that is.
        await state.create_run({})
        claim = await claim_one(state, lease=10 * SILENT_AFTER)
        run_id = claim.run.run_id
        await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
        await advance(fake_clock, 10 * SILENT_AFTER - EPSILON)
        assert await status(state, run_id) is RunStatus.RUNNING
        await advance(fake_clock, 2 * EPSILON)
        assert await status(state, run_id) is RunStatus.FAILED

    async def test_a_heartbeat_does_not_cut_short_what_the_exec_vouched_for(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        claim = await running(state)
        run_id = claim.run.run_id
        await state.renew_claim(run_id, claim.token, lease=10 * SILENT_AFTER)
        await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)
        await advance(fake_clock, 5 * SILENT_AFTER)
        assert await status(state, run_id) is RunStatus.RUNNING

    async def test_a_heartbeat_sets_the_interval_for_the_next_deadline(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        run_id = (await running(state)).run.run_id
        await state.heartbeat_run(run_id, heartbeat_interval=10.0)
        await advance(fake_clock, PATIENCE * 10.0 - EPSILON)
        assert await status(state, run_id) is RunStatus.RUNNING
        await advance(fake_clock, 2 * EPSILON)
        assert await status(state, run_id) is RunStatus.FAILED

    async def test_a_run_started_without_a_claim_is_watched_from_its_first_heartbeat(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        await state.update_run_status(run_id, RunStatus.STARTING)
        await state.update_run_status(run_id, RunStatus.RUNNING)
        await advance(fake_clock, 1000.0)
        assert await status(state, run_id) is RunStatus.RUNNING
        await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)
        await advance(fake_clock, SILENT_AFTER + EPSILON)
        assert await status(state, run_id) is RunStatus.FAILED

    async def test_heartbeat_run_tells_a_finished_run_to_end(self, state: LinkState) -> None:
        run_id = (await running(state)).run.run_id
        await state.update_run_status(run_id, RunStatus.STOPPED)
        with pytest.raises(RunFinishedError):
            await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)

    async def test_heartbeat_run_before_the_run_started_is_refused(
        self, state: LinkState, run_id: int
    ) -> None:
        with pytest.raises(InvalidTransitionError):
            await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)
        await claim_one(state)
        with pytest.raises(InvalidTransitionError):
            await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)
        assert await status(state, run_id) is RunStatus.STARTING

    @pytest.mark.parametrize("interval", [0.0, -1.0, math.nan])
    async def test_heartbeat_run_refuses_a_bad_interval(
        self, state: LinkState, interval: float
    ) -> None:
        run_id = (await running(state)).run.run_id
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.heartbeat_run(run_id, heartbeat_interval=interval)

    # Launch secrets ----------------------------------------------------------------

    async def test_the_launch_secret_opens_its_run_only(self, state: LinkState) -> None:
        for _ in range(2):
            await state.create_run({})
        mine, theirs = await state.claim_runs(limit=2, lease=CLAIM)
        run = await state.check_run_secret(mine.run.run_id, mine.secret)
        assert (run.run_id, run.status) == (mine.run.run_id, RunStatus.STARTING)
        await state.start_run(mine.run.run_id, mine.token, heartbeat_interval=INTERVAL)
        assert (await state.check_run_secret(mine.run.run_id, mine.secret)).status is (
            RunStatus.RUNNING
        )
        for wrong in (theirs.secret, mine.secret + "x", "", "\ud800"):
            with pytest.raises(RunNotFoundError):
                await state.check_run_secret(mine.run.run_id, wrong)
        with pytest.raises(RunNotFoundError):
            await state.check_run_secret(UNKNOWN_RUN_ID, mine.secret)

    async def test_the_secret_of_a_claim_that_ran_out_is_refused(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        with pytest.raises(RunNotFoundError):  # pending: no claim, no secret
            await state.check_run_secret(run_id, "")
        old = await claim_one(state)
        await advance(fake_clock, CLAIM + EPSILON)
        with pytest.raises(RunNotFoundError):
            await state.check_run_secret(run_id, old.secret)
        new = await claim_one(state)
        with pytest.raises(RunNotFoundError):
            await state.check_run_secret(run_id, old.secret)
        assert (await state.check_run_secret(run_id, new.secret)).run_id == run_id

    async def test_the_secret_outlives_the_run_for_its_server_app(self, state: LinkState) -> None:
        """Stopped, the run still knows its ServerApp: to take its last logs, and to tell it
        (``heartbeat_run``) to end."""
        claim = await running(state)
        await state.update_run_status(claim.run.run_id, RunStatus.STOPPED)
        run = await state.check_run_secret(claim.run.run_id, claim.secret)
        assert run.status is RunStatus.STOPPED

    # Announcing runs -----------------------------------------------------------------

    async def test_watch_runs_hears_each_change(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        heard = Recorder[int]()
        with state.watch_runs(heard):
            run_id = (await state.create_run({})).run_id
            claim = await claim_one(state)
            await state.renew_claim(run_id, claim.token, lease=CLAIM)  # no change
            await state.start_run(run_id, claim.token, heartbeat_interval=INTERVAL)
            await state.heartbeat_run(run_id, heartbeat_interval=INTERVAL)  # no change
            await state.update_run_status(run_id, RunStatus.COMPLETED)
            other = (await state.create_run({})).run_id
        await state.update_run_status(other, RunStatus.STOPPED)
        assert heard.calls == [run_id, run_id, run_id, run_id, other]

    async def test_watch_runs_hears_the_changes_timers_make(
        self, state: LinkState, fake_clock: FakeClock
    ) -> None:
        pending = (await state.create_run({})).run_id
        await claim_one(state)
        started = (await running(state)).run.run_id
        heard = Recorder[int]()
        with state.watch_runs(heard):
            fake_clock.advance(CLAIM + EPSILON)
            await heard.wait_for(pending)
            await heard.wait_for(started)
        assert sorted(heard.calls) == sorted([pending, started])
        assert await status(state, pending) is RunStatus.PENDING
        assert await status(state, started) is RunStatus.FAILED

    # Finishing a run, however it happens ------------------------------------------------

    async def test_a_failed_claim_drops_the_runs_messages(
        self, state: LinkState, fake_clock: FakeClock, run_id: int, steady_node: int
    ) -> None:
        message_id = await push(state, run_id, steady_node)
        for _ in range(MAX_CLAIM_ATTEMPTS):
            await claim_one(state)
            await advance(fake_clock, CLAIM + EPSILON)
        assert await status(state, run_id) is RunStatus.FAILED
        assert await state.pull_messages(steady_node) == []
        assert error_code(await the_reply(state, run_id, message_id)) == MESSAGE_UNAVAILABLE
