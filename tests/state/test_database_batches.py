"""The SQLite LinkState's Database: calls judged at their arrival, committed in batches.

Each test drives a :class:`~fedcore.state.database.Database` directly with small works
over its ``nodes`` table, and sees what reached SQLite through the connection's trace
of statements. A gate (a work that waits in its worker thread until the test opens it)
holds a transaction open so that calls queue up behind it.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from anyio.abc import TaskGroup

from fedcore.errors import LinkUnavailableError, StateError
from fedcore.state.database import MAX_BATCH, Database
from fedcore.testing import FakeClock

pytestmark = pytest.mark.anyio

WAIT = 5.0
"""Real seconds a gate waits to be opened before its test fails."""


class Gate:
    """A work that says (on the loop) when its thread entered it, then waits to be opened."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self._opened = threading.Event()

    def __call__(self, now: float) -> float:
        anyio.from_thread.run_sync(self.entered.set)
        if not self._opened.wait(WAIT):
            raise TimeoutError("the test never opened the gate")
        return now

    def open(self) -> None:
        self._opened.set()


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement that the connections opened in the test ran, in order."""
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection: sqlite3.Connection = connect(*args, **kwargs)
        connection.set_trace_callback(statements.append)
        return connection

    monkeypatch.setattr(sqlite3, "connect", traced)
    return statements


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many calls each hop to a worker thread carried (one entry per hop; the
    Database hands its thread a list of calls, anything else carries none)."""
    carried: list[int] = []
    run_sync = anyio.to_thread.run_sync

    async def counted(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        batch = args[0] if args and isinstance(args[0], list) else []
        carried.append(len(batch))
        return await run_sync(function, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return carried


@pytest.fixture
async def db(tmp_path: Path, fake_clock: FakeClock, trace: list[str]) -> AsyncIterator[Database]:
    database = Database(
        tmp_path / "link.db",
        fake_clock,
        fire=lambda due, now: _nodes_go_offline(database, due),
        reopen=lambda now: None,
    )
    async with database:
        yield database


async def held(tasks: TaskGroup, db: Database) -> Gate:
    """Start a transaction that holds ``db`` (the calls made next queue behind it) until
    the gate returned is opened."""
    gate = Gate()
    tasks.start_soon(db.transact, gate)
    with anyio.fail_after(WAIT):
        await gate.entered.wait()
    return gate


def _nodes_go_offline(db: Database, due: float) -> bool:
    """The timers of these tests: nodes whose deadline passed go offline."""
    silent = db.rows("nodes_silent_at", deadline=due)
    for (node_id,) in silent:
        db.execute("set_offline", node_id=node_id)
    return bool(silent)


def insert(db: Database, node_id: int, now: float, *, online_until: float = math.inf) -> int:
    db.execute("insert_node", node_id=node_id, heartbeat_interval=1.0, online_until=online_until)
    db.watch(online_until)
    return node_id


def exists(db: Database, node_id: int, now: float) -> bool:
    return db.row("node_online_flag", node_id=node_id) is not None


def transactions(trace: list[str]) -> list[list[str]]:
    """The statements of each transaction in ``trace`` that committed, BEGIN to COMMIT.

    Each list starts with the last ``PRAGMA synchronous`` before its BEGIN in ``trace``
    (the level it committed with, if the trace goes back to the opening), or "".
    """
    found: list[list[str]] = []
    current: list[str] | None = None
    level = ""
    for statement in trace:
        if statement.startswith("PRAGMA synchronous"):
            level = statement
        elif statement == "BEGIN IMMEDIATE":
            current = [level]
        elif statement == "COMMIT" and current is not None:
            found.append(current)
            current = None
        elif current is not None:
            current.append(statement)
    return found


def inserts_in(transaction: list[str]) -> int:
    return sum(statement.startswith("INSERT INTO nodes") for statement in transaction)


async def call_and_keep(outcomes: dict[int, object], key: int, call: Awaitable[object]) -> None:
    """Await ``call`` and keep what it returned or raised under ``key``."""
    try:
        outcomes[key] = await call
    except Exception as exc:
        outcomes[key] = exc


# Group commit --------------------------------------------------------------------


async def test_calls_queued_behind_a_transaction_commit_as_one(
    db: Database, trace: list[str], hops: list[int]
) -> None:
    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        for node_id in range(1, 11):
            tasks.start_soon(db.transact, partial(insert, db, node_id))
        await anyio.wait_all_tasks_blocked()
        trace.clear()
        hops.clear()
        gate.open()
    assert hops == [10], "one hop to a worker thread for the calls that queued"
    assert [inserts_in(transaction) for transaction in transactions(trace)] == [10]
    for node_id in range(1, 11):
        assert await db.transact(partial(exists, db, node_id))


async def test_a_batch_holds_at_most_max_batch_calls(
    db: Database, trace: list[str], hops: list[int]
) -> None:
    count = MAX_BATCH + 44
    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        for node_id in range(1, count + 1):
            tasks.start_soon(db.transact, partial(insert, db, node_id))
        await anyio.wait_all_tasks_blocked()
        trace.clear()
        hops.clear()
        gate.open()
    assert hops == [MAX_BATCH, 44]
    assert [inserts_in(transaction) for transaction in transactions(trace)] == [MAX_BATCH, 44]


async def test_a_call_that_fails_rolls_back_alone_and_gets_its_own_error(
    db: Database, trace: list[str]
) -> None:
    """Notifications of the calls that succeeded come after the commit, in call order."""
    published: list[tuple[int, str]] = []

    def announced(node_id: int, now: float) -> None:
        insert(db, node_id, now)
        db.notify(lambda: published.append((node_id, trace[-1])))

    def refused(node_id: int, now: float) -> None:
        announced(node_id, now)
        raise ValueError(f"refused {node_id}")

    def clashing(node_id: int, now: float) -> None:
        announced(node_id, now)
        insert(db, node_id, now)  # the same node id again: an SQLite constraint error

    works = {1: announced, 2: refused, 3: announced, 4: clashing, 5: announced}
    outcomes: dict[int, object] = {}
    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        for node_id, work in works.items():
            tasks.start_soon(call_and_keep, outcomes, node_id, db.transact(partial(work, node_id)))
        await anyio.wait_all_tasks_blocked()
        trace.clear()
        gate.open()
    # The first try, without savepoints, failed on call 4's second insert: it was redone
    # with each call in a savepoint. (Neither try is one transaction per call.)
    (transaction,) = transactions(trace)
    assert transaction.count("SAVEPOINT call") == 5
    assert [outcomes[1], outcomes[3], outcomes[5]] == [None, None, None]
    assert isinstance(outcomes[2], ValueError)
    assert str(outcomes[2]) == "refused 2"
    assert isinstance(outcomes[4], StateError)
    assert "UNIQUE" in str(outcomes[4])
    stored = [await db.transact(partial(exists, db, node_id)) for node_id in works]
    assert stored == [True, False, True, False, True]
    assert published == [(1, "COMMIT"), (3, "COMMIT"), (5, "COMMIT")]


async def test_a_caller_gets_its_result_only_once_its_whole_batch_committed(
    db: Database,
) -> None:
    """A push that returned is durable (R2): the calls after it in its batch commit with it."""
    later = Gate()
    returned: list[int] = []

    async def first() -> None:
        returned.append(await db.transact(partial(insert, db, 1)))

    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        tasks.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        tasks.start_soon(db.transact, later)
        await anyio.wait_all_tasks_blocked()
        gate.open()
        with anyio.fail_after(WAIT):
            await later.entered.wait()  # node 1 is inserted; its transaction is open
        await anyio.wait_all_tasks_blocked()
        assert returned == []
        later.open()
    assert returned == [1]


# Durability ------------------------------------------------------------------------


async def test_a_batch_syncs_when_any_of_its_calls_asks(db: Database, trace: list[str]) -> None:
    for durable_call in (False, True):
        async with anyio.create_task_group() as tasks:
            gate = await held(tasks, db)
            for node_id in (1, 2):
                work = partial(exists, db, node_id)
                tasks.start_soon(partial(db.transact, work, durable=False))
            if durable_call:
                tasks.start_soon(db.transact, partial(exists, db, 3))
            await anyio.wait_all_tasks_blocked()
            gate.open()
        level, *_ = transactions(trace)[-1]
        assert level == (
            "PRAGMA synchronous = FULL" if durable_call else "PRAGMA synchronous = NORMAL"
        )


async def test_timers_that_fall_due_within_an_unsynced_batch_fire_in_a_synced_transaction(
    db: Database, fake_clock: FakeClock, trace: list[str], hops: list[int]
) -> None:
    start = fake_clock.now()
    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        work = partial(insert, db, 1, online_until=start + 1.0)
        tasks.start_soon(partial(db.transact, work, durable=False))
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(2.0)
        tasks.start_soon(partial(db.transact, partial(exists, db, 1), durable=False))
        await anyio.wait_all_tasks_blocked()
        trace.clear()
        hops.clear()
        gate.open()
    assert hops == [2]
    (inserting, firing) = transactions(trace)
    assert inserting[0] == "PRAGMA synchronous = NORMAL"
    assert firing[0] == "PRAGMA synchronous = FULL"
    assert any(statement.startswith("UPDATE nodes SET online = 0") for statement in firing)


async def test_a_transaction_that_fails_fails_every_call_in_it(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """A timer that cannot fire ends the transaction: the call before it fails with it."""

    def broken(due: float, now: float) -> bool:
        raise RuntimeError("a timer bug")

    database = Database(tmp_path / "link.db", fake_clock, fire=broken, reopen=lambda now: None)
    start = fake_clock.now()
    outcomes: dict[int, object] = {}
    async with database:
        async with anyio.create_task_group() as tasks:
            gate = await held(tasks, database)
            work = partial(insert, database, 1, online_until=start + 1.0)
            tasks.start_soon(call_and_keep, outcomes, 1, database.transact(work))
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(2.0)
            tasks.start_soon(
                call_and_keep, outcomes, 2, database.transact(partial(exists, database, 1))
            )
            await anyio.wait_all_tasks_blocked()
            gate.open()
        for key in (1, 2):
            assert isinstance(outcomes[key], StateError), outcomes[key]
            assert "a timer bug" in str(outcomes[key])
        assert not await database.transact(partial(exists, database, 1))


# Arrival ---------------------------------------------------------------------------


async def test_a_call_sees_the_time_it_arrived_not_the_time_it_ran(
    db: Database, fake_clock: FakeClock
) -> None:
    outcomes: dict[int, object] = {}
    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        fake_clock.advance(5.0)
        arrived = fake_clock.now()
        tasks.start_soon(call_and_keep, outcomes, 1, db.transact(lambda now: now))
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(5.0)
        gate.open()
    assert outcomes[1] == arrived


class SteppingClock(FakeClock):
    """A fake clock whose wall time can step back, as a system clock's can."""

    def __init__(self) -> None:
        super().__init__()
        self.behind = 0.0

    def now(self) -> float:
        return super().now() - self.behind


async def test_arrival_times_never_go_back(tmp_path: Path) -> None:
    clock = SteppingClock()
    database = Database(
        tmp_path / "link.db", clock, fire=lambda due, now: False, reopen=lambda now: None
    )
    async with database:
        first = await database.transact(lambda now: now)
        clock.behind = 10.0
        assert await database.transact(lambda now: now) == first


# Cancellation and closing --------------------------------------------------------


async def test_a_call_cancelled_while_queued_never_runs(db: Database, trace: list[str]) -> None:
    scope = anyio.CancelScope()

    async def cancelled() -> None:
        with scope:
            await db.transact(partial(insert, db, 7))

    async with anyio.create_task_group() as tasks:
        gate = await held(tasks, db)
        tasks.start_soon(cancelled)
        await anyio.wait_all_tasks_blocked()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()
        trace.clear()
        gate.open()
    assert scope.cancelled_caught
    assert not await db.transact(partial(exists, db, 7))
    assert not any(statement.startswith("INSERT INTO nodes") for statement in trace)


async def test_a_call_cancelled_while_its_batch_runs_is_committed_before_it_returns(
    db: Database,
) -> None:
    gate = Gate()
    scope = anyio.CancelScope()
    returned: list[bool] = []

    def insert_then_wait(now: float) -> None:
        insert(db, 8, now)
        gate(now)

    async def cancelled() -> None:
        with scope:
            await db.transact(insert_then_wait)
        returned.append(scope.cancelled_caught)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(cancelled)
        with anyio.fail_after(WAIT):
            await gate.entered.wait()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()
        assert returned == [], "returned before its transaction committed"
        gate.open()
    assert returned == [True]
    assert await db.transact(partial(exists, db, 8))


async def test_closing_runs_the_calls_already_queued(tmp_path: Path, fake_clock: FakeClock) -> None:
    database = Database(
        tmp_path / "link.db", fake_clock, fire=lambda due, now: False, reopen=lambda now: None
    )
    outcomes: dict[int, object] = {}
    async with anyio.create_task_group() as tasks:
        async with database:
            gate = await held(tasks, database)
            tasks.start_soon(
                call_and_keep, outcomes, 9, database.transact(partial(insert, database, 9))
            )
            await anyio.wait_all_tasks_blocked()
            gate.open()
        assert outcomes == {9: 9}
        with pytest.raises(LinkUnavailableError, match="closed"):
            await database.transact(partial(exists, database, 9))
