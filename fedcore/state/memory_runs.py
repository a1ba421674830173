"""The in-memory LinkState's runs: their lifecycle, the exec's claims, bundles, contexts, logs,
metrics and artifacts.

:class:`~fedcore.state.memory.InMemoryLinkState` answers these methods with a
:class:`MemoryRuns`, after firing the timers due; the methods are synchronous, so each
is atomic. Its two timers go on the state's heap (a claim running out while its run is
``starting``, a running run's ServerApp missing its heartbeat deadline); one whose
deadline a renewal or heartbeat moved finds that out when it fires, and does nothing.
The moves themselves are :mod:`fedcore.state.ledger`'s. Contexts and artifacts are kept
packed by :mod:`fedcore.wire` and metrics as JSON text, as the SQLite state keeps them,
so both refuse the same contents and a caller's later change reaches nothing saved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fedcore.clock import Clock
from fedcore.domain import LogLine, MetricsLine, RecordDict, Run, RunStatus
from fedcore.errors import NotFoundError, RunNotFoundError
from fedcore.state.base import RunClaim
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
from fedcore.wire import STORED_LIMITS, pack_recorddict, unpack_recorddict


@dataclass(slots=True)
class _RunRow:
    run: Run
    attempts: int = 0  # claims made of the run
    token: int | None = None  # the live claim's fencing token; None when no claim is
    claim_until: float = math.inf
    secret: bytes | None = None  # digest of the latest claim's launch secret
    heartbeat_interval: float = math.inf
    alive_until: float | None = None  # the ServerApp's deadline, once it is watched
    logs: list[LogLine] = field(default_factory=list)
    last_log_batch: str = ""
    contexts: dict[int, bytes] = field(default_factory=dict)  # packed RecordDicts
    metrics: list[str] = field(default_factory=list)  # JSON objects, line n at index n - 1
    last_metrics_batch: str = ""
    artifacts: dict[str, bytes] = field(default_factory=dict)  # packed RecordDicts


class MemoryRuns:
    """Runs, claims, bundles, contexts, logs, metrics and artifacts, in dictionaries.

    ``schedule(deadline, fire)`` puts a timer on the state's heap; ``drop_messages``
    deletes a finished run's messages and replies.
    """

    def __init__(
        self,
        clock: Clock,
        ids: random.Random,
        heartbeat_patience: float,
        *,
        schedule: Callable[[float, Callable[[], None]], None],
        drop_messages: Callable[[int], None],
    ) -> None:
        self._clock = clock
        self._ids = ids
        self._patience = heartbeat_patience
        self._schedule = schedule
        self._drop_messages = drop_messages
        self._runs: dict[int, _RunRow] = {}
        self._bundles: dict[str, bytes] = {}
        self._tokens = itertools.count(1)
        self._run_topic: Topic[int, int] = Topic()
        self._log_topic: Topic[int, int] = Topic()
        self._metrics_topic: Topic[int, int] = Topic()

    # Runs --------------------------------------------------------------------------

    def _row(self, run_id: int) -> _RunRow:
        row = self._runs.get(run_id)
        if row is None:
            raise RunNotFoundError(f"no run {run_id}")
        return row

    def status(self, run_id: int) -> RunStatus:
        """The run's status; ``RunNotFoundError``."""
        return self._row(run_id).run.status

    def create_run(self, run_config: dict[str, Any], seed: int | None, bundle_hash: str) -> Run:
        if bundle_hash and bundle_hash not in self._bundles:
            raise NotFoundError(f"no bundle {bundle_hash!r}")
        run_id = new_id(self._ids, self._runs.__contains__)
        run = Run(
            run_id=run_id,
            run_config=dict(run_config),
            seed=seed,
            bundle_hash=bundle_hash,
            created_at=self._clock.now(),
        )
        self._runs[run_id] = _RunRow(run)
        self._run_topic.publish(run_id, run_id)
        return _copy(run)

    def list_runs(self) -> list[Run]:
        return [_copy(row.run) for row in self._runs.values()]

    def get_run(self, run_id: int) -> Run:
        return _copy(self._row(run_id).run)

    def update_run_status(
        self, run_id: int, status: RunStatus, reason: str, token: int | None
    ) -> Run:
        row = self._row(run_id)
        if token is not None:
            check_claim_token(run_id, row.token, token)
        self._move(row, move_run(row.run.status, status, reason, self._clock.now()))
        return _copy(row.run)

    def _move(self, row: _RunRow, move: RunMove) -> None:
        """Keep a run's move and do what its new status asks."""
        row.run.status, row.run.reason = move.status, move.reason
        if move.drop_claim:
            row.token, row.secret = None, None
        if move.end_claim:
            row.token, row.alive_until = None, None
            row.run.finished_at = move.finished_at
            self._drop_messages(row.run.run_id)
        self._run_topic.publish(row.run.run_id, row.run.run_id)

    def watch_runs(self, callback: Callable[[int], None]) -> Subscription:
        return self._run_topic.subscribe(callback)

    # Claims: the exec's side ------------------------------------------------------

    def claim_runs(self, limit: int, lease: float) -> list[RunClaim]:
        if limit < 0:
            raise ValueError(f"cannot claim {limit} runs")
        check_lease(lease)
        pending = [row for row in self._runs.values() if row.run.status is RunStatus.PENDING]
        claims = []
        for row in pending[:limit]:
            move = claimed(row.run.status, self._clock.now())
            secret, row.secret = new_launch_secret()
            row.token, row.attempts = next(self._tokens), row.attempts + 1
            self._claim_until(row, self._clock.now() + lease)
            self._move(row, move)
            claims.append(
                RunClaim(_copy(row.run), row.token, secret, row.attempts, row.claim_until)
            )
        return claims

    def renew_claim(self, run_id: int, token: int, lease: float) -> float:
        check_lease(lease)
        row = self._row(run_id)
        check_claim_token(run_id, row.token, token)
        self._claim_until(row, self._clock.now() + lease)
        if row.run.status is RunStatus.RUNNING and row.alive_until is not None:
            # The exec holds the ServerApp's process and renews only while it runs:
            # its renewal vouches for the process, whatever the app's own code does.
            self._alive_until(row, max(row.alive_until, row.claim_until))
        return row.claim_until

    def _claim_until(self, row: _RunRow, deadline: float) -> None:
        row.claim_until = deadline
        self._schedule(deadline, partial(self._check_claim, row, row.token, deadline))

    def _check_claim(self, row: _RunRow, token: int | None, deadline: float) -> None:
        if row.run.status is not RunStatus.STARTING or row.token != token:
            return
        if row.claim_until > deadline:
            return
        self._move(row, claim_expired(row.run.status, row.attempts, self._clock.now()))

    def start_run(self, run_id: int, token: int, heartbeat_interval: float) -> Run:
        check_heartbeat_interval(heartbeat_interval)
        row = self._row(run_id)
        check_claim_token(run_id, row.token, token)
        move = started(row.run.status, self._clock.now())
        if move is not None:
            self._move(row, move)
            # The claimant has just started the process: it vouches for it until its
            # claim runs out, when its next renewal is due at the latest.
            self._watch_server_app(row, heartbeat_interval, vouched_until=row.claim_until)
        return _copy(row.run)

    def heartbeat_run(self, run_id: int, heartbeat_interval: float) -> Run:
        check_heartbeat_interval(heartbeat_interval)
        row = self._row(run_id)
        check_running(run_id, row.run.status)
        self._watch_server_app(row, heartbeat_interval)
        return _copy(row.run)

    def _watch_server_app(
        self, row: _RunRow, heartbeat_interval: float, *, vouched_until: float = -math.inf
    ) -> None:
        """The ServerApp spoke: alive for a patience, and never less than vouched for."""
        row.heartbeat_interval = heartbeat_interval
        alive_until = silent_at(self._clock.now(), self._patience, heartbeat_interval)
        if row.alive_until is not None:
            vouched_until = max(vouched_until, row.alive_until)
        self._alive_until(row, max(alive_until, vouched_until))

    def _alive_until(self, row: _RunRow, deadline: float) -> None:
        row.alive_until = deadline
        self._schedule(deadline, partial(self._check_server_app, row, deadline))

    def rearm(self, since: float, now: float) -> None:
        """The link stalled from ``since`` to ``now``: re-arm what lapsed meanwhile.

        A ServerApp gets a full patience from now, a claim the time the stall took.
        """
        for row in self._runs.values():
            status = row.run.status
            alive_until = row.alive_until
            if status is RunStatus.RUNNING and alive_until is not None:
                if since < alive_until <= now:
                    self._alive_until(row, silent_at(now, self._patience, row.heartbeat_interval))
            elif status is RunStatus.STARTING and since < row.claim_until <= now:
                self._claim_until(row, row.claim_until + (now - since))

    def _check_server_app(self, row: _RunRow, deadline: float) -> None:
        if row.run.status is not RunStatus.RUNNING or row.alive_until is None:
            return
        if row.alive_until > deadline:
            return
        now = self._clock.now()
        self._move(
            row, serverapp_silent(row.run.status, self._patience, row.heartbeat_interval, now)
        )

    def check_run_secret(self, run_id: int, secret: str) -> Run:
        row = self._runs.get(run_id)
        if row is None or not secret_matches(row.secret, secret):
            raise RunNotFoundError(f"no run {run_id}")
        return _copy(row.run)

    # Bundles, contexts and logs ----------------------------------------------------

    def put_bundle(self, data: bytes) -> str:
        bundle_hash = hashlib.sha256(data).hexdigest()
        self._bundles.setdefault(bundle_hash, bytes(data))
        return bundle_hash

    def get_bundle(self, bundle_hash: str) -> bytes:
        try:
            return self._bundles[bundle_hash]
        except KeyError:
            raise NotFoundError(f"no bundle {bundle_hash!r}") from None

    def save_context(self, run_id: int, node_id: int, state: RecordDict) -> None:
        self._row(run_id).contexts[node_id] = pack_recorddict(state)

    def load_context(self, run_id: int, node_id: int) -> RecordDict:
        packed = self._row(run_id).contexts.get(node_id)
        return RecordDict() if packed is None else unpack_recorddict(packed, STORED_LIMITS)

    def append_logs(self, run_id: int, lines: Sequence[str], batch: str) -> int:
        if isinstance(lines, str):
            raise TypeError("append_logs takes a sequence of lines, not one str")
        row = self._row(run_id)
        logs = row.logs
        if batch:
            if batch == row.last_log_batch:
                return len(logs)
            row.last_log_batch = batch
        now = self._clock.now()
        logs += [LogLine(seq, now, text) for seq, text in enumerate(lines, len(logs) + 1)]
        if lines:
            self._log_topic.publish(run_id, len(logs))
        return len(logs)

    def get_logs(self, run_id: int, after: int, limit: int) -> list[LogLine]:
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        first = max(after, 0)  # line n sits at index n - 1
        return self._row(run_id).logs[first : first + limit]

    def watch_logs(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._log_topic.subscribe(callback, run_id)

    # Metrics and artifacts -----------------------------------------------------------

    def append_metrics(self, run_id: int, documents: Sequence[dict[str, Any]], batch: str) -> int:
        row = self._row(run_id)
        encoded = encode_metrics(documents)
        if batch:
            if batch == row.last_metrics_batch:
                return len(row.metrics)
            row.last_metrics_batch = batch
        row.metrics += encoded
        if encoded:
            self._metrics_topic.publish(run_id, len(row.metrics))
        return len(row.metrics)

    def get_metrics(self, run_id: int, after: int, limit: int) -> list[MetricsLine]:
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        first = max(after, 0)
        kept = self._row(run_id).metrics[first : first + limit]
        return [decode_metrics(seq, text) for seq, text in enumerate(kept, first + 1)]

    def watch_metrics(self, run_id: int, callback: Callable[[int], None]) -> Subscription:
        return self._metrics_topic.subscribe(callback, run_id)

    def put_artifact(self, run_id: int, name: str, content: RecordDict) -> None:
        check_artifact_name(name)
        self._row(run_id).artifacts[name] = pack_recorddict(content)

    def get_artifact(self, run_id: int, name: str) -> RecordDict:
        packed = self._row(run_id).artifacts.get(name)
        if packed is None:
            raise missing_artifact(run_id, name)
        return unpack_recorddict(packed, STORED_LIMITS)


def _copy(run: Run) -> Run:
    return dataclasses.replace(run, run_config=dict(run.run_config))
