"""The SQLite LinkState's runs: their lifecycle, the exec's claims, bundles, contexts, logs,
metrics and artifacts.

:class:`~fedcore.state.sqlite.SqliteLinkState` answers these methods with a
:class:`SqliteRuns` on its :class:`~fedcore.state.database.Database`, and fires its
timers (a claim running out while its run is ``starting``, a running run's ServerApp
missing its heartbeat deadline); each move is :mod:`fedcore.state.ledger`'s. Each
public method here is one transaction; the private ones run inside one, in its thread.
A claim is three columns of the run: its fencing token (from a one-row counter, so
tokens only grow, across restarts too), its end, and the SHA-256 of its launch secret.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from fedcore.domain import ConfigRecord, LogLine, MetricsLine, RecordDict, Run, RunStatus
from fedcore.errors import NotFoundError, RunNotFoundError
from fedcore.state.base import RunClaim
from fedcore.state.database import INT64, Database
from fedcore.state.ledger import (
    RunMove,
    check_artifact_name,
    check_claim_token,
    check_heartbeat_interval,
    check_lease,
    check_running,
    claim_expired,
    claimed,
    decode_metrics,
    encode_metrics,
    missing_artifact,
    move_run,
    new_id,
    new_launch_secret,
    secret_matches,
    serverapp_silent,
    silent_at,
    started,
)
from fedcore.state.notify import Subscription, Topic
from fedcore.wire import (
    STORED_LIMITS,
    pack_recorddict,
    pack_recorddict_parts,
    parts_size,
    unpack_recorddict,
)

_RUN_CONFIG = "run_config"


class SqliteRuns:
    """Runs, claims, bundles, contexts, logs, metrics and artifacts, in the tables of ``db``."""

    def __init__(self, db: Database, ids: random.Random, heartbeat_patience: float) -> None:
        self._db = db
        self._ids = ids
        self._patience = heartbeat_patience
        self._run_topic: Topic[int, int] = Topic()
        self._log_topic: Topic[int, int] = Topic()
        self._metrics_topic: Topic[int, int] = Topic()

    # Timers ------------------------------------------------------------------------

    def fire(self, due: float, now: float) -> bool:
        """Fire the claims and ServerApp deadlines stored for ``due`` (found at ``now``);
        say if there were."""
        ending = self._db.rows("claims_ending_at", deadline=due)
        for run_id, attempts in ending:
            self._move(run_id, claim_expired(RunStatus.STARTING, attempts, now))
        silent = self._db.rows("server_apps_silent_at", deadline=due)
        for run_id, heartbeat_interval in silent:
            move = serverapp_silent(RunStatus.RUNNING, self._patience, heartbeat_interval, now)
            self._move(run_id, move)
        return bool(ending or silent)

    def rearm(self, since: float, now: float) -> None:
        """The link stalled from ``since`` to ``now``: re-arm the run deadlines that lapsed."""
        self._db.execute("rearm_claims", since=since, now=now)
        self._db.execute("rearm_server_apps", since=since, now=now, patience=self._patience)

    def reopen(self, now: float) -> None:
        """The link's downtime is not its ServerApps' silence: give each a full patience."""
        self._db.execute("extend_running_runs", now=now, patience=self._patience)

    # Runs --------------------------------------------------------------------------

    async def create_run(
        self, run_config: dict[str, Any], *, seed: int | None = None, bundle_hash: str = ""
    ) -> Run:
        if seed is not None and seed not in INT64:
            raise ValueError(f"seed must fit in a signed 64-bit integer, got {seed}")
        config = ConfigRecord(run_config)
        packed = pack_recorddict(RecordDict({_RUN_CONFIG: config}))
        return await self._db.transact(partial(self._create_run, packed, seed, bundle_hash))

    def _create_run(self, run_config: bytes, seed: int | None, bundle_hash: str, now: float) -> Run:
        if bundle_hash and self._db.row("bundle_exists", bundle_hash=bundle_hash) is None:
            raise NotFoundError(f"no bundle {bundle_hash!r}")
        run_id = new_id(
            self._ids, lambda candidate: self._db.row("run_id_taken", id=candidate) is not None
        )
        self._db.execute(
            "insert_run",
            run_id=run_id,
            run_config=run_config,
            status=RunStatus.PENDING.value,
            seed=seed,
            bundle_hash=bundle_hash,
            created_at=now,
        )
        self._db.notify(partial(self._run_topic.publish, run_id, run_id))
        return self._get_run(run_id)

    async def list_runs(self) -> list[Run]:
        return await self._db.transact(
            lambda now: [_run_from(row) for row in self._db.rows("list_runs")]
        )

    async def get_run(self, run_id: int) -> Run:
        return await self._db.transact(lambda now: self._get_run(run_id))

    def _run_row(self, run_id: int) -> sqlite3.Row:
        row = self._db.row("get_run", run_id=run_id) if run_id in INT64 else None
        if row is None:
            raise RunNotFoundError(f"no run {run_id}")
        return row

    def _get_run(self, run_id: int) -> Run:
        return _run_from(self._run_row(run_id))

    def status(self, run_id: int) -> RunStatus:
        """The run's status, in a transaction under way; ``RunNotFoundError``."""
        row = self._db.row("run_status", run_id=run_id) if run_id in INT64 else None
        if row is None:
            raise RunNotFoundError(f"no run {run_id}")
        return RunStatus(row["status"])

    async def update_run_status(
        self, run_id: int, status: RunStatus, reason: str = "", *, token: int | None = None
    ) -> Run:
        return await self._db.transact(
            partial(self._update_run_status, run_id, status, reason, token)
        )

    def _update_run_status(
        self, run_id: int, status: RunStatus, reason: str, token: int | None, now: float
    ) -> Run:
        row = self._run_row(run_id)
        if token is not None:
            check_claim_token(run_id, row["claim_token"], token)
        self._move(run_id, move_run(RunStatus(row["status"]), status, reason, now))
        return self._get_run(run_id)

    def _move(self, run_id: int, move: RunMove) -> None:
        """Keep a run's move and do what its new status asks."""
        self._db.execute(
            "update_run_status",
            run_id=run_id,
            status=move.status.value,
            reason=move.reason,
            finished_at=move.finished_at,
        )
        if move.drop_claim:
            self._db.execute("drop_claim", run_id=run_id)
        if move.end_claim:
            self._db.execute("end_claim", run_id=run_id)
            self._db.execute("delete_run_messages", run_id=run_id)
        self._db.notify(partial(self._run_topic.publish, run_id, run_id))

    def watch_runs(self, callback: Callable[[int], None]) -> Subscription:
        return self._run_topic.subscribe(callback)

    # Claims: the exec's side ------------------------------------------------------

    async def claim_runs(self, *, limit: int, lease: float) -> list[RunClaim]:
        if limit < 0:
            raise ValueError(f"cannot claim {limit} runs")
        check_lease(lease)
        return await self._db.transact(partial(self._claim_runs, limit, lease))

    def _claim_runs(self, limit: int, lease: float, now: float) -> list[RunClaim]:
        claims = []
        for (run_id,) in self._db.rows("pending_run_ids", limit=limit):
            move = claimed(RunStatus.PENDING, now)
            next_token = self._db.row("next_token")
            assert next_token is not None  # the counter's one row, from the migration
            token: int = next_token[0]
            secret, digest = new_launch_secret()
            claim_until = now + lease
            self._db.execute(
                "claim_run",
                run_id=run_id,
                status=move.status.value,
                reason=move.reason,
                token=token,
                claim_until=claim_until,
                secret_hash=digest,
            )
            self._db.watch(claim_until)
            self._db.notify(partial(self._run_topic.publish, run_id, run_id))
            row = self._run_row(run_id)
            claims.append(RunClaim(_run_from(row), token, secret, row["attempts"], claim_until))
        return claims

    async def renew_claim(self, run_id: int, token: int, *, lease: float) -> float:
        check_lease(lease)
        return await self._db.transact(partial(self._renew_claim, run_id, token, lease))

    def _renew_claim(self, run_id: int, token: int, lease: float, now: float) -> float:
        check_claim_token(run_id, self._run_row(run_id)["claim_token"], token)
        claim_until = now + lease
        self._db.execute("renew_claim", run_id=run_id, claim_until=claim_until)
        self._db.watch(claim_until)
        return claim_until

    async def start_run(self, run_id: int, token: int, *, heartbeat_interval: float) -> Run:
        check_heartbeat_interval(heartbeat_interval)
        return await self._db.transact(partial(self._start_run, run_id, token, heartbeat_interval))

    def _start_run(self, run_id: int, token: int, heartbeat_interval: float, now: float) -> Run:
        row = self._run_row(run_id)
        check_claim_token(run_id, row["claim_token"], token)
        status = RunStatus(row["status"])
        move = started(status, now)
        if move is not None:
            self._move(run_id, move)
            self._watch_server_app(run_id, heartbeat_interval, now)
            # The claimant has just started the process: it vouches for it until its
            # claim runs out, when its next renewal is due at the latest.
            self._db.execute("vouch_until_claim_ends", run_id=run_id)
        return self._get_run(run_id)

    async def heartbeat_run(self, run_id: int, *, heartbeat_interval: float) -> Run:
        check_heartbeat_interval(heartbeat_interval)
        return await self._db.transact(
            partial(self._heartbeat_run, run_id, heartbeat_interval), durable=False
        )

    def _heartbeat_run(self, run_id: int, heartbeat_interval: float, now: float) -> Run:
        check_running(run_id, self.status(run_id))
        self._watch_server_app(run_id, heartbeat_interval, now)
        return self._get_run(run_id)

    def _watch_server_app(self, run_id: int, heartbeat_interval: float, now: float) -> None:
        alive_until = silent_at(now, self._patience, heartbeat_interval)
        self._db.execute(
            "watch_server_app",
            run_id=run_id,
            heartbeat_interval=heartbeat_interval,
            alive_until=alive_until,
        )
        self._db.watch(alive_until)

    async def check_run_secret(self, run_id: int, secret: str) -> Run:
        return await self._db.transact(partial(self._check_run_secret, run_id, secret))

    def _check_run_secret(self, run_id: int, secret: str, now: float) -> Run:
        row = self._run_row(run_id)
        if not secret_matches(row["secret_hash"], secret):
            raise RunNotFoundError(f"no run {run_id}")
        return _run_from(row)

    # Bundles, contexts and logs ----------------------------------------------------

    async def put_bundle(self, data: bytes) -> str:
        return await self._db.transact(partial(self._put_bundle, data))

    def _put_bundle(self, data: bytes, now: float) -> str:
        bundle_hash = hashlib.sha256(data).hexdigest()
        self._db.execute("insert_bundle", bundle_hash=bundle_hash, data=data)
        return bundle_hash

    async def get_bundle(self, bundle_hash: str) -> bytes:
        return await self._db.transact(partial(self._get_bundle, bundle_hash))

    def _get_bundle(self, bundle_hash: str, now: float) -> bytes:
        row = self._db.row("get_bundle", bundle_hash=bundle_hash)
        if row is None:
            raise NotFoundError(f"no bundle {bundle_hash!r}")
        return bytes(row["data"])

    async def save_context(self, run_id: int, node_id: int, state: RecordDict) -> None:
        if node_id not in INT64:
            raise ValueError(f"node_id must fit in a signed 64-bit integer, got {node_id}")
        await self._db.transact(partial(self._save_context, run_id, node_id, state))

    def _save_context(self, run_id: int, node_id: int, state: RecordDict, now: float) -> None:
        self.status(run_id)
        self._keep_record(
            state, "save_context", "contexts", "state", run_id=run_id, node_id=node_id
        )

    async def load_context(self, run_id: int, node_id: int) -> RecordDict:
        return await self._db.transact(partial(self._load_context, run_id, node_id))

    def _load_context(self, run_id: int, node_id: int, now: float) -> RecordDict:
        self.status(run_id)
        if node_id not in INT64:  # no context was saved for it: save_context refuses it
            return RecordDict()
        row = self._db.row("load_context", run_id=run_id, node_id=node_id)
        if row is None:
            return RecordDict()
        return unpack_recorddict(
            self._db.read_blob("contexts", "state", row["rowid"]), STORED_LIMITS
        )

    async def append_logs(self, run_id: int, lines: Sequence[str], *, batch: str = "") -> int:
        if isinstance(lines, str):
            raise TypeError("append_logs takes a sequence of lines, not one str")
        return await self._db.transact(partial(self._append_logs, run_id, list(lines), batch))

    def _append_logs(self, run_id: int, lines: list[str], batch: str, now: float) -> int:
        self.status(run_id)
        last_row = self._db.row("last_log_seq", run_id=run_id)
        last: int = 0 if last_row is None else last_row[0]
        if batch:
            stored = self._db.row("last_log_batch", run_id=run_id)
            if stored is not None and stored[0] == batch:
                return last  # the same batch again: a retry after a lost response
            self._db.execute("set_last_log_batch", run_id=run_id, batch=batch)
        for text in lines:
            last += 1
            self._db.execute("insert_log", run_id=run_id, seq=last, time=now, text=text)
        if lines:
            self._db.notify(partial(self._log_topic.publish, run_id, last))
        return last

    async def get_logs(self, run_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        return await self._db.transact(partial(self._get_logs, run_id, after, limit))

    def _get_logs(self, run_id: int, after: int, limit: int, now: float) -> list[LogLine]:
        self.status(run_id)
        last = INT64.stop - 1  # what SQLite can bind; no run has more lines
        rows = self._db.rows(
            "get_logs", run_id=run_id, after=max(0, min(after, last)), limit=min(limit, last)
        )
        return [LogLine(row["seq"], row["time"], row["text"]) for row in rows]

    def watch_logs(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._log_topic.subscribe(callback, run_id)

    # Metrics and artifacts -----------------------------------------------------------

    async def append_metrics(
        self, run_id: int, documents: Sequence[dict[str, Any]], *, batch: str = ""
    ) -> int:
        encoded = encode_metrics(documents)
        return await self._db.transact(partial(self._append_metrics, run_id, encoded, batch))

    def _append_metrics(self, run_id: int, documents: list[str], batch: str, now: float) -> int:
        self.status(run_id)
        last_row = self._db.row("last_metrics_seq", run_id=run_id)
        last: int = 0 if last_row is None else last_row[0]
        if batch:
            stored = self._db.row("last_metrics_batch", run_id=run_id)
            if stored is not None and stored[0] == batch:
                return last  # the same batch again: a retry after a lost response
            self._db.execute("set_last_metrics_batch", run_id=run_id, batch=batch)
        for document in documents:
            last += 1
            self._db.execute("insert_metrics", run_id=run_id, seq=last, document=document)
        if documents:
            self._db.notify(partial(self._metrics_topic.publish, run_id, last))
        return last

    async def get_metrics(
        self, run_id: int, *, after: int = 0, limit: int = 1000
    ) -> list[MetricsLine]:
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        return await self._db.transact(partial(self._get_metrics, run_id, after, limit))

    def _get_metrics(self, run_id: int, after: int, limit: int, now: float) -> list[MetricsLine]:
        self.status(run_id)
        last = INT64.stop - 1
        rows = self._db.rows(
            "get_metrics", run_id=run_id, after=max(0, min(after, last)), limit=min(limit, last)
        )
        return [decode_metrics(row["seq"], row["document"]) for row in rows]

    def watch_metrics(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._metrics_topic.subscribe(callback, run_id)

    async def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        check_artifact_name(name)
        await self._db.transact(partial(self._put_artifact, run_id, name, content))

    def _put_artifact(self, run_id: int, name: str, content: RecordDict, now: float) -> None:
        self.status(run_id)
        self._keep_record(content, "put_artifact", "artifacts", "content", run_id=run_id, name=name)

    async def get_artifact(self, run_id: int, name: str) -> RecordDict:
        return await self._db.transact(partial(self._get_artifact, run_id, name))

    def _get_artifact(self, run_id: int, name: str, now: float) -> RecordDict:
        self.status(run_id)
        row = self._db.row("get_artifact", run_id=run_id, name=name)
        if row is None:
            raise missing_artifact(run_id, name)
        return unpack_recorddict(
            self._db.read_blob("artifacts", "content", row["rowid"]), STORED_LIMITS
        )

    def _keep_record(
        self, record: RecordDict, query: str, table: str, column: str, **keys: object
    ) -> None:
        """Keep ``record`` in the blob ``column`` of the ``table`` row that ``query``
        inserts or updates (it takes ``keys`` and the blob's ``size``, and returns the
        row's ``rowid``), streamed in without a copy of the whole."""
        parts = pack_recorddict_parts(record)
        row = self._db.row(query, **keys, size=parts_size(parts))
        assert row is not None  # RETURNING the row inserted or updated
        self._db.write_blob(table, column, row["rowid"], parts)


def _run_from(row: sqlite3.Row) -> Run:
    config = unpack_recorddict(row["run_config"], STORED_LIMITS).config_records[_RUN_CONFIG]
    return Run(
        run_id=row["run_id"],
        run_config=dict(config),
        status=RunStatus(row["status"]),
        reason=row["reason"],
        seed=row["seed"],
        bundle_hash=row["bundle_hash"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
    )
