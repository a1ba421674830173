"""SqliteLinkState's runs across restarts: what a file keeps, and how its run timers resume.

The conformance suite (fedcore.testing.runstate) runs in test_sqlite_state.py; here,
what only a file can show: fencing tokens, bundles, contexts and logs survive closing
and reopening; a running run's ServerApp gets a full patience window from the opening,
while a claim that ran out meanwhile fires at once; a database of schema version 1
gains runs in a known order.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import state_on

from fedcore.domain import ConfigRecord, Message, RecordDict, RunStatus
from fedcore.errors import ClaimLostError
from fedcore.state.ledger import MAX_CLAIM_ATTEMPTS
from fedcore.state.sql import MIGRATIONS, SCHEMA_VERSION
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import PATIENCE
from fedcore.wire import pack_recorddict

pytestmark = pytest.mark.anyio

INTERVAL = 1.0
EPSILON = 0.01
CLAIM = 5.0


async def test_fencing_tokens_keep_growing_across_restarts(
    path: Path, fake_clock: FakeClock
) -> None:
    tokens = []
    for _ in range(3):
        async with state_on(path, fake_clock) as state:
            await state.create_run({})
            (claim,) = await state.claim_runs(limit=1, lease=CLAIM)
            tokens.append(claim.token)
    assert tokens == sorted(set(tokens)), f"a token was handed out again: {tokens}"


async def test_bundles_contexts_and_logs_survive_a_restart(
    path: Path, fake_clock: FakeClock
) -> None:
    saved = RecordDict({"config": ConfigRecord({"round": 3})})
    async with state_on(path, fake_clock) as state:
        bundle_hash = await state.put_bundle(b"bundle bytes")
        created = await state.create_run({"lr": 0.5}, bundle_hash=bundle_hash)
        await state.save_context(created.run_id, 7, saved)
        await state.append_logs(created.run_id, ["one", "two"])
    fake_clock.advance(60.0)
    async with state_on(path, fake_clock) as state:
        assert await state.get_bundle(bundle_hash) == b"bundle bytes"
        assert await state.load_context(created.run_id, 7) == saved
        assert await state.append_logs(created.run_id, ["three"]) == 3
        lines = await state.get_logs(created.run_id)
        assert [(line.seq, line.text) for line in lines] == [(1, "one"), (2, "two"), (3, "three")]
        assert lines[0].time == created.created_at
        assert await state.list_runs() == [created]


async def test_retries_after_a_restart_store_nothing_twice(
    path: Path, fake_clock: FakeClock
) -> None:
    """A ServerApp's push or log batch whose response the link's death lost, sent again."""
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        node_id = await state.create_node(heartbeat_interval=math.inf)
        pushed = Message(RecordDict({"c": ConfigRecord({"x": 1})}), node_id, "train")
        pushed.metadata.message_id = "e" * 32
        await state.push_messages(run_id, [pushed])
        await state.append_logs(run_id, ["round 1"], batch="app-1")
    async with state_on(path, fake_clock) as state:
        again = Message(RecordDict({"c": ConfigRecord({"x": 1})}), node_id, "train")
        again.metadata.message_id = "e" * 32
        assert await state.push_messages(run_id, [again]) == ["e" * 32]
        assert len(await state.pull_messages(node_id)) == 1
        assert await state.append_logs(run_id, ["round 1"], batch="app-1") == 1
        assert [line.text for line in await state.get_logs(run_id)] == ["round 1"]


async def test_a_running_run_gets_a_full_patience_after_a_restart(
    path: Path, fake_clock: FakeClock
) -> None:
    """The link's downtime is not the ServerApp's silence; one that stays away still fails."""
    async with state_on(path, fake_clock) as state:
        run_ids = []
        for _ in range(2):
            await state.create_run({})
            (claim,) = await state.claim_runs(limit=1, lease=CLAIM)
            await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=INTERVAL)
            run_ids.append(claim.run.run_id)
        back, away = run_ids
    fake_clock.advance(100.0)
    async with state_on(path, fake_clock) as state:
        assert [run.status for run in await state.list_runs()] == [RunStatus.RUNNING] * 2
        fake_clock.advance(PATIENCE * INTERVAL - 0.5)
        await state.heartbeat_run(back, heartbeat_interval=INTERVAL)
        assert (await state.get_run(away)).status is RunStatus.RUNNING
        fake_clock.advance(0.5 + EPSILON)
        assert (await state.get_run(back)).status is RunStatus.RUNNING
        assert (await state.get_run(away)).status is RunStatus.FAILED


async def test_a_claim_that_ran_out_while_closed_fires_on_opening(
    path: Path, fake_clock: FakeClock
) -> None:
    """Announced to subscribers that were there before the state was entered."""
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        (first,) = await state.claim_runs(limit=1, lease=CLAIM)
    fake_clock.advance(CLAIM + EPSILON)
    restarted = state_on(path, fake_clock)
    heard: list[int] = []
    with restarted.watch_runs(heard.append):
        async with restarted as state:
            assert heard == [run_id]
            assert (await state.get_run(run_id)).status is RunStatus.PENDING
            with pytest.raises(ClaimLostError):
                await state.renew_claim(run_id, first.token, lease=CLAIM)
            (second,) = await state.claim_runs(limit=1, lease=CLAIM)
            assert (second.attempt, second.token > first.token) == (2, True)


async def test_claims_that_ran_out_across_restarts_still_fail_the_run(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
    for _ in range(MAX_CLAIM_ATTEMPTS):
        async with state_on(path, fake_clock) as state:
            await state.claim_runs(limit=1, lease=CLAIM)
        fake_clock.advance(CLAIM + EPSILON)
    async with state_on(path, fake_clock) as state:
        run = await state.get_run(run_id)
        assert run.status is RunStatus.FAILED
        assert await state.claim_runs(limit=1, lease=CLAIM) == []


async def test_only_the_digest_of_a_launch_secret_is_stored(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        (claim,) = await state.claim_runs(limit=1, lease=CLAIM)
    async with state_on(path, fake_clock) as state:
        assert (await state.check_run_secret(run_id, claim.secret)).run_id == run_id
    stored = b"".join(file.read_bytes() for file in path.parent.iterdir())
    assert claim.secret.encode() not in stored
    with sqlite3.connect(path) as connection:
        (digest,) = connection.execute("SELECT secret_hash FROM runs").fetchone()
    connection.close()
    assert len(digest) == 32


async def test_runs_of_a_version_1_database_come_first_in_id_order(
    path: Path, fake_clock: FakeClock
) -> None:
    """Schema 1 kept no creation order: its runs keep the order of their ids."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    for statement in MIGRATIONS[0]:
        connection.execute(statement)
    config = pack_recorddict(RecordDict({"run_config": ConfigRecord({"old": True})}))
    for run_id in (30, 10, 20):
        connection.execute(
            "INSERT INTO runs (run_id, run_config, status) VALUES (?, ?, 'pending')",
            (run_id, config),
        )
    connection.execute("PRAGMA user_version = 1")
    connection.close()
    async with state_on(path, fake_clock) as state:
        newer = await state.create_run({})
        runs = await state.list_runs()
        assert [run.run_id for run in runs] == [10, 20, 30, newer.run_id]
        assert [(run.created_at, run.bundle_hash) for run in runs[:3]] == [(0.0, "")] * 3
        assert runs[0].run_config == {"old": True}
        claims = await state.claim_runs(limit=2, lease=CLAIM)
        assert [claim.run.run_id for claim in claims] == [10, 20]
    with sqlite3.connect(path) as connection:
        (version,) = connection.execute("PRAGMA user_version").fetchone()
    connection.close()
    assert version == SCHEMA_VERSION


async def test_a_context_node_id_beyond_64_bits_is_refused(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        with pytest.raises(ValueError, match="node_id"):
            await state.save_context(run_id, 2**64 - 1, RecordDict())
        assert await state.load_context(run_id, 2**64 - 1) == RecordDict()


async def test_huge_log_positions_are_just_past_the_end(path: Path, fake_clock: FakeClock) -> None:
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        await state.append_logs(run_id, ["only"])
        assert await state.get_logs(run_id, after=2**70) == []
        assert len(await state.get_logs(run_id, after=-(2**70), limit=2**70)) == 1


async def test_a_never_ending_heartbeat_interval_is_stored(
    path: Path, fake_clock: FakeClock
) -> None:
    """``math.inf`` is a REAL SQLite keeps: such a ServerApp is never declared silent."""
    async with state_on(path, fake_clock) as state:
        await state.create_run({})
        (claim,) = await state.claim_runs(limit=1, lease=CLAIM)
        await state.start_run(claim.run.run_id, claim.token, heartbeat_interval=math.inf)
    fake_clock.advance(1e9)
    async with state_on(path, fake_clock) as state:
        assert (await state.get_run(claim.run.run_id)).status is RunStatus.RUNNING
