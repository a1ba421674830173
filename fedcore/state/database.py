"""An SQLite file for a LinkState: one connection off the loop, calls committed in
batches, each judged at the time it arrived, timers kept as stored deadlines.

:class:`Database` knows nothing of nodes or runs; the SQLite LinkState
(:mod:`fedcore.state.sqlite`) gives it the work of each call and says how to fire the
timers that fall due. What it guarantees:

**A call is judged at the time it arrived.** Its time (``now``) is read from the clock
when the call is made, on the event loop (an injected clock may belong to it), before
it waits for anything; its work, and the timers fired before it, see that time. A
heartbeat that came before its node's deadline keeps the node online however long it
then queued behind slow transactions. Calls run in the order they came (one FIFO
queue), and arrival times never go back (each is at least the one before, should the
wall clock step back), so the timers fired before a call are exactly those due by its
arrival, and no call sees a time earlier than one already seen. The reaper (below) is a
caller like any other: it queues at the deadline it woke for, behind whatever came
before it.

**Group commit, off the event loop.** sqlite3 calls block, so all database work runs
in anyio's worker threads, on one connection. The calls that queued up while a batch
ran form the next batch (at most :data:`MAX_BATCH`): one writer task hands it to a
worker thread in one hop, and it runs in one ``BEGIN IMMEDIATE … COMMIT``, in arrival
order. With a thousand nodes heartbeating, one hop and one commit per call would spend
the link's time handing work between the loop and the threads, and a loop busy
elsewhere would make each call wait for it; a batch pays once, and catches up at once
after a stall (a garbage collection, a slow fsync). ``BEGIN IMMEDIATE`` holds the write
lock from the start, so a transaction never fails half-way on a lock. The connection
moves between pool threads (``check_same_thread=False``), which SQLite allows as long
as two batches never overlap; the one writer sees to that.

**Each call succeeds or fails alone.** A call whose work refuses
(``NodeNotFoundError``, a ``ValueError``…) or hits an SQLite error is undone alone: its
own changes and notifications vanish, the timers fired before it stay fired (as in
memory), the batch goes on, and the exception is raised to that caller alone (SQLite
errors as :class:`~fedcore.errors.StateError`). Works check before they write, so a
refusal nearly always comes before any change, and there is nothing to undo; calls
run without savepoints, because every statement costs the worker thread the GIL (see
:meth:`Database._run`). A call that fails after changing rows has its transaction
rolled back and redone with each call in a savepoint. A failure that ends the
transaction itself (a failed ``COMMIT``, an I/O error, a timer that cannot fire) fails
every call of that transaction with a ``StateError``; the calls after it in the batch
run in a new one.

**Durable before it returns.** WAL with ``synchronous=FULL``: a commit returns once the
log is on disk, and callers get their results only after their batch committed, so a
reply whose push returned survives ``kill -9`` and power loss (R2, docs/reliability.md). A call
may ask for ``durable=False`` (heartbeats do): a batch of such calls alone commits with
``synchronous=NORMAL`` — atomic and consistent, just not synced before returning. A
batch with any durable call, or one that fires timers, commits with ``FULL``; any later
durable commit syncs earlier ones anyway, since the log is written in order. (SQLite
cannot change the level inside a transaction: when a call of a ``NORMAL`` batch finds a
timer due that an earlier call of the batch stored, what came before commits, and the
rest of the batch follows in a ``FULL`` transaction, in the same thread hop.)

**Cancellation.** A caller cancelled while its call waits in the queue takes it out:
nothing of it happens. Once its batch has started, the call's effect is committed all
the same: the caller waits, shielded, for the commit, then sees its cancellation.

**Timers are columns.** Every deadline is a stored time; the ``next_deadline`` query
gives the earliest. Before each call's own work, the timers due by its arrival are
fired, earliest first, by the ``fire`` function the state gave. The earliest deadline
is cached (every call that stores one reports it with :meth:`Database.watch`), so a
call with nothing due runs no timer query; a reaper task sleeps on the injected clock
until that deadline and fires the timers even when nobody calls, so that
notifications come on time. Opening the file is a restart: the stored deadlines keep
running on the clock (Unix time, so across processes and machines); before the timers
that passed while it was closed fire, the state's ``reopen`` function may move the
deadlines that the downtime should not count against. A stall of the event loop is a
short downtime: with a :class:`~fedcore.state.stalls.StallWatch`, the first call to
arrive after one carries it, and the state's ``rearm`` function moves the deadlines
that passed during it before that call fires anything.

**Notifications after the commit.** Work in the thread queues them
(:meth:`Database.notify`); they are published on the event loop once the batch
committed, in call order, before any caller resumes, and dropped if their call or
transaction rolled back.

**Closing** refuses new calls, lets the queued ones run, then closes the file.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, cast

import anyio
from anyio.abc import TaskGroup

from fedcore.clock import Clock
from fedcore.errors import LinkUnavailableError, StateError
from fedcore.state.sql import QUERIES, migrate
from fedcore.state.stalls import Stall, StallWatch
from fedcore.wire import Parts
from fedcore.wire.frame import slices
from fedcore.wire.spool import Spool

T = TypeVar("T")

BUSY_TIMEOUT = 30.0
"""Seconds a connection waits for another process's write lock before it gives up."""

MAX_BATCH = 256
"""The most calls one transaction runs: a bound on how long the calls that arrive
meanwhile wait, and on the work lost to a failed commit."""

INT64 = range(-(2**63), 2**63)
"""What an SQLite INTEGER holds. No node or run has an id outside it, so such an id is
unknown (the wire allows unsigned 64-bit ids)."""


class _Call(Generic[T]):
    """A call of :meth:`Database.transact`: its work, its arrival, and once its batch
    committed, its outcome."""

    __slots__ = (
        "_error",
        "_result",
        "done",
        "durable",
        "now",
        "settled",
        "stall",
        "started",
        "work",
    )

    def __init__(
        self, work: Callable[[float], T], now: float, durable: bool, stall: Stall | None
    ) -> None:
        self.work = work
        self.now = now
        self.durable = durable
        self.stall = stall  # the loop's stall that ended just before this call arrived
        self.started = False  # taken into a batch: it can no longer be withdrawn
        self.settled = False
        self.done = anyio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def succeed(self, result: T) -> None:
        self._result, self._error, self.settled = result, None, True

    def fail(self, error: BaseException) -> None:
        self._result, self._error, self.settled = None, error, True

    def outcome(self) -> T:
        if self._error is not None:
            raise self._error
        if not self.settled:
            raise StateError("the database stopped before this call's transaction ended")
        return cast(T, self._result)


BLOB_PIECE = 1 << 20
"""Bytes of a blob read or written at a time (see :meth:`Database.write_blob`)."""


class Database:
    """An SQLite file (or ``":memory:"``) opened by ``async with``, closed on leaving.

    ``fire(due, now)`` fires, at ``now``, the timers stored for the deadline ``due``
    and says whether there were any; ``reopen(now)`` runs in the transaction that
    opens the file, before anything fires; ``rearm(since, now)``, when ``stalls`` is
    given, before the timers due after each stall of the event loop fire.
    """

    # Made on opening, on the event loop (anyio makes neither outside one).
    _arrived: anyio.Event
    _reaper: anyio.CancelScope
    _ticker: anyio.CancelScope

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock,
        *,
        fire: Callable[[float, float], bool],
        reopen: Callable[[float], None],
        rearm: Callable[[float, float], None] | None = None,
        stalls: StallWatch | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        self._fire = fire
        self._reopen = reopen
        self._rearm = rearm
        self._stalls = stalls
        self._stall: Stall | None = None  # found by the watch's ticker, for the next call
        self._connection: sqlite3.Connection | None = None
        self._queue: deque[_Call[Any]] | None = None  # None until first opened
        self._closed = False
        self._last_arrival = -math.inf
        self._task_group: TaskGroup | None = None
        self._syncing = True  # the connection's level: synchronous=FULL
        # Every stored deadline is at or after _next_deadline (it is a lower bound).
        self._next_deadline = -math.inf
        self._wakeup: anyio.Event | None = None
        self._sleeping_until = math.inf
        self._events: list[Callable[[], None]] = []

    async def __aenter__(self) -> Self:
        if self._queue is not None and not self._closed:
            raise RuntimeError(f"the SqliteLinkState on {self.path!r} is already open")
        # A call made while the file opens waits in the queue.
        self._queue, self._closed, self._arrived = deque(), False, anyio.Event()
        self._next_deadline, self._wakeup, self._sleeping_until = -math.inf, None, math.inf
        self._events, self._reaper, self._ticker = [], anyio.CancelScope(), anyio.CancelScope()
        try:
            with self._translated_errors():
                await anyio.to_thread.run_sync(self._open, self._arrival())
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._task_group.start_soon(self._write, name="sqlite-linkstate-writer")
            await self.transact(_nothing)  # fires what fell due while the file was closed
            self._task_group.start_soon(self._reap, name="sqlite-linkstate-reaper")
            if self._stalls is not None:
                self._stalls.on_stall(self._stalled)
                self._task_group.start_soon(self._watch_stalls, name="sqlite-linkstate-stalls")
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
        # The body's exception is not the writer's: let it propagate as it is.
        await self._close()

    def _open(self, now: float) -> None:
        connection = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            connection.row_factory = sqlite3.Row
            mode = _write_ahead(connection)
            if mode not in ("wal", "memory"):
                raise StateError(f"{self.path!r} cannot use a write-ahead log (mode {mode!r})")
            connection.execute("PRAGMA synchronous = FULL")
            self._syncing = True
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
        """Refuse new calls, let the writer run the queued ones, then close the file."""
        self._closed = True
        self._arrived.set()
        self._reaper.cancel()
        self._ticker.cancel()
        try:
            if self._task_group is not None:
                task_group, self._task_group = self._task_group, None
                await task_group.__aexit__(None, None, None)
        finally:
            for call in self._queue or ():  # left when the writer was cancelled
                call.fail(self._closed_error())
                call.done.set()
            if self._queue is not None:
                self._queue.clear()
            connection, self._connection = self._connection, None
            if connection is not None:
                with anyio.CancelScope(shield=True), self._translated_errors():
                    await anyio.to_thread.run_sync(connection.close)

    def _closed_error(self) -> LinkUnavailableError:
        """What a call to the closed file raises: the link is shutting down (a request in
        progress as its state closes), so its caller, a node or a ServerApp, tries again
        once the link is back rather than take it for an answer."""
        return LinkUnavailableError(
            f"the SqliteLinkState on {self.path!r} is closed: the link is shutting down"
        )

    # Calls ---------------------------------------------------------------------------

    @contextmanager
    def _translated_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: BaseException) -> StateError:
        failure = StateError(f"the SQLite database {self.path!r} failed: {exc}")
        failure.__cause__ = exc
        return failure

    def _arrival(self) -> float:
        """The clock's time now, or the last arrival's if the clock stepped back."""
        self._last_arrival = max(self._clock.now(), self._last_arrival)
        return self._last_arrival

    def _stalled(self, since: float, now: float) -> None:
        """The watch's ticker found a stall: the next call to arrive re-arms for it."""
        if self._stall is not None:
            since = min(since, self._stall[0])
        self._stall = (since, now)
        if self._wakeup is not None:
            self._wakeup.set()  # the reaper's deadline may have passed during the stall

    def _take_stall(self, now: float) -> Stall | None:
        """The stall of the event loop that ended by ``now`` and was not re-armed yet."""
        if self._stalls is None:
            return None
        stall, self._stall = self._stall, None
        found = self._stalls.catch_up(now)
        if found is not None:
            stall = found if stall is None else (min(stall[0], found[0]), found[1])
        return stall

    async def transact(self, work: Callable[[float], T], *, durable: bool = True) -> T:
        """Run ``work(now)`` in a transaction in a worker thread; its result once committed.

        ``now`` is the time of this call, not of the transaction.
        """
        if self._queue is None:
            raise RuntimeError("open the SqliteLinkState with `async with` before using it")
        if self._closed:
            raise self._closed_error()
        now = self._arrival()
        call = _Call(work, now, durable, self._take_stall(now))
        self._queue.append(call)
        self._arrived.set()
        try:
            await call.done.wait()
        except anyio.get_cancelled_exc_class():
            if not call.started:
                if not call.done.is_set():  # else refused by closing, not queued any more
                    self._queue.remove(call)
                raise
            with anyio.CancelScope(shield=True):
                await call.done.wait()
            raise
        return call.outcome()

    async def _write(self) -> None:
        """Run the queued calls, batch after batch, until the database closes."""
        assert self._queue is not None
        while True:
            if not self._queue:
                if self._closed:
                    return
                self._arrived = anyio.Event()
                await self._arrived.wait()
                continue
            batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
            for call in batch:
                call.started = True
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(self._run_batch, batch)
                finally:
                    self._publish()
                    for call in batch:
                        call.done.set()

    def _publish(self) -> None:
        """On the event loop, after a batch: notify, and wake the reaper if needed."""
        events, self._events = self._events, []
        for publish in events:
            publish()
        if self._wakeup is not None and self._next_deadline < self._sleeping_until:
            self._wakeup.set()

    # In the worker thread ------------------------------------------------------------

    def _run_batch(self, batch: list[_Call[Any]]) -> None:
        start, careful = 0, False
        while start < len(batch):
            try:
                start = self._transaction(batch, start, careful=careful)
                careful = False
            except _Redo:
                careful = True

    def _transaction(self, batch: list[_Call[Any]], start: int, *, careful: bool) -> int:
        """Run ``batch`` from ``start`` in one transaction; return where it stopped.

        Raises :class:`_Redo`, with the transaction rolled back, when a call that is not
        ``careful`` (in a savepoint) failed after changing rows.
        """
        db = self._db
        calls = batch[start:]
        # Arrivals only grow: if the last call fires no timer stored so far, none does.
        durable = any(call.durable for call in calls) or calls[-1].now >= self._next_deadline
        cached_deadline = self._next_deadline
        published = len(self._events)
        end = start
        try:
            self._synchronous(durable)
            db.execute("BEGIN IMMEDIATE")
            for call in calls:
                if call.now >= self._next_deadline:
                    if not durable:
                        break  # see "Durable" above: the rest commits with FULL
                    if call.stall is not None and self._rearm is not None:
                        self._rearm(*call.stall)
                    self._fire_timers(call.now)
                self._run(call, careful=careful)
                end += 1
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            del self._events[published:]
            self._next_deadline = min(self._next_deadline, cached_deadline)
            if isinstance(exc, _Redo) or not isinstance(exc, Exception):
                raise
            for call in batch[start : end + 1]:  # those rolled back, and the one under way
                call.fail(self._failure(exc))
            return end + 1
        return end

    def _run(self, call: _Call[Any], *, careful: bool) -> None:
        """Run ``call``'s work; if it fails, undo it alone (see "Each call…" above).

        sqlite3 lets go of the GIL around every statement, and while the event loop is
        busy the worker thread then waits up to a switch interval (5 ms) to get it
        back: with a savepoint around each, a thousand heartbeats on a busy loop took
        four times as long. So a call runs without one unless it is ``careful``: one
        that fails before changing a row has nothing to undo; one that fails after
        raises :class:`_Redo`, and the transaction is redone with each call careful.
        (A redo draws new ids for the calls before the failed one.)
        """
        db = self._db
        if careful:
            db.execute("SAVEPOINT call")
        changes, published = db.total_changes, len(self._events)
        try:
            call.succeed(call.work(call.now))
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and not db.in_transaction:
                raise  # SQLite ended the transaction: it fails whole
            if careful:
                db.execute("ROLLBACK TO call")
            elif db.total_changes != changes:
                raise _Redo from exc
            del self._events[published:]
            call.fail(self._failure(exc) if isinstance(exc, sqlite3.Error) else exc)
        if careful:
            db.execute("RELEASE call")

    def _synchronous(self, durable: bool) -> None:
        """Have the next commit sync (``FULL``) or not (``NORMAL``)."""
        if durable != self._syncing:
            self._db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            self._syncing = durable

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

    def write_blob(self, table: str, column: str, rowid: int, parts: Parts) -> None:
        """Write ``parts`` into the blob in ``column`` of row ``rowid``, a piece at a time.

        The blob must have the parts' size already (``zeroblob``): incremental blob
        I/O cannot grow a value, and a model never becomes one ``bytes`` on the way.
        """
        with self._db.blobopen(table, column, rowid) as blob:
            for piece in slices(parts, BLOB_PIECE):
                blob.write(piece)

    def read_blob(self, table: str, column: str, rowid: int) -> memoryview:
        """The blob in ``column`` of row ``rowid``, read a piece at a time into a mapped spool."""
        with self._db.blobopen(table, column, rowid, readonly=True) as blob, Spool() as spool:
            while piece := blob.read(BLOB_PIECE):
                spool.write(piece)
            return spool.mapped()

    def watch(self, deadline: float) -> None:
        """A deadline was stored: make sure the timers fire by then."""
        self._next_deadline = min(self._next_deadline, deadline)

    def notify(self, event: Callable[[], None]) -> None:
        """Call ``event`` on the event loop once this call's batch has committed."""
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

    async def _watch_stalls(self) -> None:
        assert self._stalls is not None
        with self._ticker:
            await self._stalls.run()

    async def _reap(self) -> None:
        with self._reaper:
            while not self._closed:
                self._wakeup = anyio.Event()
                if self._clock.now() >= self._next_deadline:
                    await self.transact(_nothing)
                    continue
                self._sleeping_until = self._next_deadline
                delay = self._sleeping_until - self._clock.now()
                with self._clock.move_on_after(None if math.isinf(delay) else delay):
                    await self._wakeup.wait()


class _Redo(Exception):
    """A call failed after changing rows, outside a savepoint: redo the transaction."""


def _nothing(now: float) -> None:
    """The work of a transaction that only fires the timers due."""


def _write_ahead(connection: sqlite3.Connection) -> str:
    """Switch the file to WAL mode; the journal mode it is in then.

    Switching needs the file to itself for a moment, and SQLite answers "database is
    locked" at once, without its busy timeout, when another process opening the same
    fresh file holds a lock just then (seen in 3 of 60 tries of four processes). So
    the switch is tried again, in real time like the busy timeout itself, for as long.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT
    pause = 0.005
    while True:
        try:
            (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)  # in the opening thread, never on the event loop
            pause = min(pause * 2, 0.2)
            continue
        return str(mode)
