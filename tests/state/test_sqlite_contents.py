"""SqliteLinkState's message contents: in their own table, stored once per distinct content.

A message's status changes (lease, renewal, reply) must not write its content again; a
content that a ServerApp sends to many nodes is encoded, hashed and stored once, read
once when they pull it, and deleted with the last message that refers to it. A file of
schema version 2, which kept contents in the message rows, moves them over.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import fedcore.state.sqlite_contents
from fedcore.domain import ArrayRecord, ConfigRecord, Message, RecordDict, RunStatus
from fedcore.state.sql import MIGRATIONS, SCHEMA_VERSION
from fedcore.state.sqlite import SqliteLinkState
from fedcore.testing import FakeClock
from fedcore.testing.linkstate import PATIENCE
from fedcore.wire import pack_recorddict

pytestmark = pytest.mark.anyio

MODEL_FLOATS = 2**18
"""A 1 MiB float32 model: 256 pages of the database."""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "link.db"


def state_on(path: Path, clock: FakeClock) -> SqliteLinkState:
    return SqliteLinkState(path, clock, heartbeat_patience=PATIENCE)


def model(value: float = 1.0) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.full(MODEL_FLOATS, value, np.float32)})})


def small(value: int = 1) -> RecordDict:
    return RecordDict({"config": ConfigRecord({"x": value})})


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        (rows,) = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
    connection.close()
    return int(rows)


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """Record each call of ``fedcore.state.sqlite_contents.<name>`` (it still does its work)."""
    calls: list[object] = []
    original: Callable[..., Any] = getattr(fedcore.state.sqlite_contents, name)

    def counted(value: object, *args: Any, **kwargs: Any) -> Any:
        calls.append(value)
        return original(value, *args, **kwargs)

    monkeypatch.setattr(fedcore.state.sqlite_contents, name, counted)
    return calls


async def test_a_content_sent_to_many_nodes_is_stored_once(
    path: Path, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoded and hashed once per content object; stored once per distinct bytes."""
    encoded = counting(monkeypatch, "pack_recorddict")
    shared, equal, other = model(), model(), model(2.0)
    async with state_on(path, fake_clock) as state:
        node_ids = await state.create_nodes(50, heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        messages = [Message(shared, node_id, "train") for node_id in node_ids]
        messages += [Message(equal, node_ids[0], "train"), Message(other, node_ids[1], "train")]
        await state.push_messages(run_id, messages)
        assert len(encoded) == 3
        pulled = await state.pull_messages(node_ids[0])
        assert [message.content for message in pulled] == [shared, equal]
    assert (count(path, "contents"), count(path, "messages")) == (2, 52)


async def test_status_changes_do_not_write_the_content_again(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        (message_id,) = await state.push_messages(run_id, [Message(model(), node_id, "train")])
        with sqlite3.connect(path) as other:
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            (pulled,) = await state.pull_messages(node_id, lease=30.0)
            assert await state.renew_leases(node_id, [message_id], lease=30.0) == []
            await state.push_reply(node_id, Message(small(), reply_to=pulled))
            (_, frames, _) = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        other.close()
    # Three small commits write a few pages each; one copy of the content is 256 pages.
    # (Three copies stay under the 1,000 pages that would restart the log.)
    assert frames < 64, f"{frames} pages written: the content was written again"


async def test_a_pull_reads_each_content_once(
    path: Path, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages that share a content, pulled together, share one decoded content."""
    decoded = counting(monkeypatch, "unpack_recorddict")
    async with state_on(path, fake_clock) as state:
        node_ids = await state.create_nodes(4, heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        content = model()
        messages = [Message(content, node_id, "train") for node_id in node_ids]
        await state.push_messages(run_id, [*messages, Message(content, node_ids[0], "evaluate")])
        pulled: dict[int, list[Message]] = {}

        async def pull(node_id: int) -> None:
            pulled[node_id] = await state.pull_messages(node_id)

        async with anyio.create_task_group() as tasks:
            for node_id in node_ids:
                tasks.start_soon(pull, node_id)
        contents = [message.content for each in pulled.values() for message in each]
    assert len(contents) == 5
    assert all(each is contents[0] for each in contents)
    assert contents[0] == content
    assert len(decoded) == 1


async def test_a_content_goes_with_the_last_message_that_refers_to_it(
    path: Path, fake_clock: FakeClock
) -> None:
    async with state_on(path, fake_clock) as state:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        first, second = [(await state.create_run({})).run_id for _ in range(2)]
        (acked,) = await state.push_messages(first, [Message(model(), node_id, "train")])
        await state.push_messages(second, [Message(model(), node_id, "train")])
        await state.push_messages(second, [Message(small(), node_id, "train")])
        assert count(path, "contents") == 2
        (pulled, *_) = await state.pull_messages(node_id)
        await state.push_reply(node_id, Message(small(7), reply_to=pulled))
        await state.ack_replies(first, [acked])
        assert count(path, "contents") == 2, "the second run still sends the model"
        await state.update_run_status(second, RunStatus.STOPPED)
    assert (count(path, "contents"), count(path, "messages")) == (0, 0)


async def test_a_file_does_not_grow_round_after_round(path: Path, fake_clock: FakeClock) -> None:
    """Each round's model is deleted once acknowledged: its pages are used again."""
    pages = []
    async with state_on(path, fake_clock) as state:
        node_ids = await state.create_nodes(4, heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        for round_number in range(6):
            content = model(float(round_number))
            sent = [Message(content, node_id, "train") for node_id in node_ids]
            message_ids = await state.push_messages(run_id, sent)
            for node_id in node_ids:
                (pulled,) = await state.pull_messages(node_id)
                await state.push_reply(node_id, Message(small(), reply_to=pulled))
            await state.ack_replies(run_id, message_ids)
            pages.append(page_count(path))
    assert pages[-1] == pages[1], f"the database grew: {pages} pages"


def page_count(path: Path) -> int:
    """The database's size in pages, as its write-ahead log has it."""
    with sqlite3.connect(path) as connection:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
    connection.close()
    return int(pages)


async def test_a_version_2_file_moves_its_contents(path: Path, fake_clock: FakeClock) -> None:
    shared, other = pack_recorddict(small(1)), pack_recorddict(small(2))
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    for statement in [*MIGRATIONS[0], *MIGRATIONS[1]]:
        connection.execute(statement)
    config = pack_recorddict(RecordDict({"run_config": ConfigRecord({})}))
    connection.execute(
        "INSERT INTO runs (run_id, position, run_config, status) VALUES (5, 1, ?, 'running')",
        (config,),
    )
    connection.execute(
        "INSERT INTO nodes (node_id, heartbeat_interval, online_until) VALUES (9, 1e9, 9e99)"
    )
    now = fake_clock.now()
    for message_id, content in (("a", shared), ("b", shared), ("c", other)):
        connection.execute(
            "INSERT INTO messages (message_id, run_id, dst_node_id, message_type, group_id, "
            "created_at, ttl, expires_at, status, content) "
            "VALUES (?, 5, 9, 'train', '', ?, 600, ?, 'pending', ?)",
            (message_id, now, now + 600, content),
        )
    connection.execute("PRAGMA user_version = 2")
    connection.close()
    async with state_on(path, fake_clock) as state:
        pulled = await state.pull_messages(9)
        assert [message.metadata.message_id for message in pulled] == ["a", "b", "c"]
        assert [message.content for message in pulled] == [small(1), small(1), small(2)]
        await state.push_reply(9, Message(small(3), reply_to=pulled[0]))
        (reply,) = await state.get_replies(5, ["a"])
        assert reply.content == small(3)
    with sqlite3.connect(path) as connection:
        (version,) = connection.execute("PRAGMA user_version").fetchone()
        columns = [row[1] for row in connection.execute("PRAGMA table_info(messages)")]
        (integrity,) = connection.execute("PRAGMA integrity_check").fetchone()
    connection.close()
    assert version == SCHEMA_VERSION
    assert "content" not in columns
    assert count(path, "contents") == 2
    assert integrity == "ok"
