"""An SQLite file for a LinkState: one connection off the loop, one transaction per call,
timers kept as stored deadlines.

:class:`Database` knows nothing of nodes or runs; the SQLite LinkState
(:mod:`fedcore.state.sqlite`) gives it the work of each call and says how to fire the
timers that fall due. What it guarantees:

**One connection, off the event loop.** sqlite3 calls block, so all database work runs
in anyio's worker threads. One connection serves every call, and an ``anyio.Lock``
lets one transaction at a time use it, in the order the callers came. The lock is held
around "run the transaction in a thread, then publish its notifications", so
notifications come out in commit order and the next transaction sees an up-to-date
deadline cache (below) — which a ``CapacityLimiter(1)`` on the thread call alone would
not guarantee, and a dedicated thread would only add a queue to. The connection moves
between pool threads (``check_same_thread=False``), which SQLite allows as long as two
calls never overlap; the lock sees to that. The clock is read on the loop, under the
lock, and handed to the thread: an injected clock may belong to the loop.

**One transaction per call.** Each call is one ``BEGIN IMMEDIATE … COMMIT``: atomic,
as the memory state's methods are by running without an await, and holding the write
lock from the start, so a transaction never fails half-way on a lock. A call that
refuses (``NodeNotFoundError``, a ``ValueError``…) rolls back to a savepoint: its own
changes vanish, but the timers that fell due before it stay fired, as in memory.
SQLite errors are raised as :class:`~fedcore.errors.StateError`.

**Durable.** WAL with ``synchronous=FULL``: a commit returns once the log is on disk,
so a reply whose push returned survives ``kill -9`` and power loss (DESIGN.md R2).
A call may ask for ``durable=False`` (heartbeats do): its commit is atomic and
consistent, just not synced before returning (``synchronous=NORMAL``). Any later
durable commit syncs it anyway, since the log is written in order.

**Timers are columns.** Every deadline is a stored time; the ``next_deadline`` query
gives the earliest. Before each call's own work, the timers that fell due are fired,
earliest first, by the ``fire`` function the state gave. The earliest deadline is
cached (every call that stores one reports it with :meth:`Database.watch`), so a call
with nothing due runs no timer query; a reaper task sleeps on the injected clock until
that deadline and fires the timers even when nobody calls, so that notifications come
on time. Opening the file is a restart: the stored deadlines keep running on the clock
(Unix time, so across processes and machines); before the timers that passed while it
was closed fire, the state's ``reopen`` function may move the deadlines that the
downtime should not count against.

**Notifications after the commit.** Work in the thread queues them
(:meth:`Database.notify`); they are published on the event loop once the transaction
committed, and dropped if it did not.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock
from fedcore.errors import StateError
from fedcore.state.sql import QUERIES, migrate

T = TypeVar("T")

BUSY_TIMEOUT = 30.0
"""Seconds a connection waits for another process's write lock before it gives up."""

INT64 = range(-(2**63), 2**63)
"""What an SQLite INTEGER holds. No node or run has an id outside it, so such an id is
unknown (the wire allows unsigned 64-bit ids)."""


class Database:
    """An SQLite file (or ``":memory:"``) opened by ``async with``, closed on leaving.

    ``fire(due, now)`` fires, at ``now``, the timers stored for the deadline ``due``
    and says whether there were any; ``reopen(now)`` runs in the transaction that
    opens the file, before anything fires.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock,
        *,
        fire: Callable[[float, float], bool],
        reopen: Callable[[float], None],
    ) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        self._fire = fire
        self._reopen = reopen
        self._connection: sqlite3.Connection | None = None
        self._lock: anyio.Lock | None = None
        self._task_group: TaskGroup | None = None
        # Every stored deadline is at or after _next_deadline (it is a lower bound).
        self._next_deadline = -math.inf
        self._wakeup: anyio.Event | None = None
        self._sleeping_until = math.inf
        self._events: list[Callable[[], None]] = []

    async def __aenter__(self) -> Self:
        if self._connection is not None:
            raise RuntimeError(f"the SqliteLinkState on {self.path!r} is already open")
        self._lock = anyio.Lock()
        self._next_deadline, self._wakeup, self._sleeping_until = -math.inf, None, math.inf
        async with self._lock:  # a call made meanwhile waits for the file to be open
            with self._translated_errors():
                await anyio.to_thread.run_sync(self._open, self._clock.now())
        try:
            await self.transact(_nothing)  # fires what fell due while the file was closed
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._task_group.start_soon(self._reap, name="sqlite-linkstate-reaper")
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        # The body's exception is not the reaper's: let it propagate as it is.
        await self._task_group.__aexit__(None, None, None)
        self._task_group = None
        await self._close()

    def _open(self, now: float) -> None:
        connection = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            connection.row_factory = sqlite3.Row
            (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode not in ("wal", "memory"):
                raise StateError(f"{self.path!r} cannot use a write-ahead log (mode {mode!r})")
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute("PRAGMA foreign_keys = ON")
            migrate(connection)
            self._connection = connection
            connection.execute("BEGIN IMMEDIATE")
            self._reopen(now)
            connection.execute("COMMIT")
        except BaseException:
            self._connection = None
            connection.close()
            raise

    async def _close(self) -> None:
        if self._lock is None:
            return
        with anyio.CancelScope(shield=True), self._translated_errors():
            async with self._lock:  # after the transaction under way, if any
                connection, self._connection = self._connection, None
                if connection is not None:
                    await anyio.to_thread.run_sync(connection.close)

    # Transactions ----------------------------------------------------------------

    @contextmanager
    def _translated_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StateError(f"the SQLite database {self.path!r} failed: {exc}") from exc

    async def transact(self, work: Callable[[float], T], *, durable: bool = True) -> T:
        """Run ``work(now)`` in one transaction in a worker thread, then notify."""
        if self._lock is None:
            raise RuntimeError("open the SqliteLinkState with `async with` before using it")
        async with self._lock:
            if self._connection is None:
                raise RuntimeError(f"the SqliteLinkState on {self.path!r} is closed")
            now = self._clock.now()  # on the loop: the clock may belong to it (FakeClock)
            try:
                with self._translated_errors():
                    return await anyio.to_thread.run_sync(self._transaction, work, now, durable)
            finally:
                self._publish()

    def _transaction(self, work: Callable[[float], T], now: float, durable: bool) -> T:
        """In a worker thread: fire the timers due by ``now``, then ``work``; commit both.

        A refusal raised by ``work`` undoes only ``work``: it is raised after the
        commit. Anything else, and any SQLite error, rolls everything back.
        """
        db = self._db
        cached_deadline = self._next_deadline
        if not durable:
            if now >= cached_deadline:
                self._transaction(_nothing, now, durable=True)  # fired timers kept durably
            db.execute("PRAGMA synchronous = NORMAL")
        refusal: Exception | None = None
        try:
            db.execute("BEGIN IMMEDIATE")
            if now >= self._next_deadline:
                self._fire_timers(now)
            fired = len(self._events)
            db.execute("SAVEPOINT work")
            try:
                result = work(now)
            except sqlite3.Error:
                raise
            except Exception as exc:
                db.execute("ROLLBACK TO work")
                del self._events[fired:]
                refusal = exc
            db.execute("RELEASE work")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._events.clear()
            self._next_deadline = min(self._next_deadline, cached_deadline)
            raise
        finally:
            if not durable:
                db.execute("PRAGMA synchronous = FULL")
        if refusal is not None:
            raise refusal
        return result

    def _publish(self) -> None:
        """On the event loop, after a transaction: notify, and wake the reaper if needed."""
        events, self._events = self._events, []
        for publish in events:
            publish()
        if self._wakeup is not None and self._next_deadline < self._sleeping_until:
            self._wakeup.set()

    # What work does, in its transaction -----------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        assert self._connection is not None
        return self._connection

    def execute(self, query: str, **params: Any) -> int:
        """Run the named query; return how many rows it changed."""
        return self._db.execute(QUERIES[query], params).rowcount

    def row(self, query: str, **params: Any) -> sqlite3.Row | None:
        """The first row of the named query, if any."""
        row: sqlite3.Row | None = self._db.execute(QUERIES[query], params).fetchone()
        return row

    def rows(self, query: str, **params: Any) -> list[sqlite3.Row]:
        """Every row of the named query."""
        return self._db.execute(QUERIES[query], params).fetchall()

    def watch(self, deadline: float) -> None:
        """A deadline was stored: make sure the timers fire by then."""
        self._next_deadline = min(self._next_deadline, deadline)

    def notify(self, event: Callable[[], None]) -> None:
        """Call ``event`` on the event loop once this transaction has committed."""
        self._events.append(event)

    # Timers ------------------------------------------------------------------------

    def _fire_timers(self, now: float) -> None:
        """Fire every stored timer due by ``now``, earliest first; cache the next one."""
        while True:
            row = self.row("next_deadline")
            due = None if row is None else row[0]
            if due is None or due > now:
                self._next_deadline = math.inf if due is None else due
                return
            if not self._fire(due, now):
                # Only a schema or query bug gets here; looping on would hang the link.
                raise StateError(f"no timer matches the deadline {due!r} that is due")

    async def _reap(self) -> None:
        while True:
            self._wakeup = anyio.Event()
            if self._clock.now() >= self._next_deadline:
                await self.transact(_nothing)
                continue
            self._sleeping_until = self._next_deadline
            delay = self._sleeping_until - self._clock.now()
            with self._clock.move_on_after(None if math.isinf(delay) else delay):
                await self._wakeup.wait()


def _nothing(now: float) -> None:
    """The work of a transaction that only fires the timers due."""
