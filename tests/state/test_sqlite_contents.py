"""SqliteLinkState's contents: in their own table, stored once per distinct content.

A message's status changes (lease, renewal, reply) must not write its content again; a
content that a ServerApp sends to many nodes is encoded, hashed and stored once, read
once when they pull it, and deleted with the last message or reply that refers to it.
A content is read into a mapped spool, never whole into memory. Files of schema
version 2 (contents in the message rows) and 4 (in the reply rows) move them over.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from sqlite_helpers import state_on

import fedcore.state.sqlite_contents
from fedcore.domain import ArrayRecord, ConfigRecord, Message, RecordDict, RunStatus
from fedcore.state.sql import MIGRATIONS, SCHEMA_VERSION
from fedcore.testing import FakeClock
from fedcore.testing.arrays import backing
from fedcore.wire import pack_recorddict

pytestmark = pytest.mark.anyio

MODEL_FLOATS = 2**18
"""A 1 MiB float32 model: 256 pages of the database."""


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
    encoded = counting(monkeypatch, "pack_recorddict_parts")
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


async def test_replies_are_stored_once_with_what_they_echo(
    path: Path, fake_clock: FakeClock
) -> None:
    """A node that sends its model back stores nothing new; acknowledging frees it all."""
    async with state_on(path, fake_clock) as state:
        node_ids = await state.create_nodes(3, heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        sent = model()
        message_ids = await state.push_messages(
            run_id, [Message(sent, node_id, "train") for node_id in node_ids]
        )
        for node_id, content in zip(node_ids, [model(), model(), model(3.0)], strict=True):
            (pulled,) = await state.pull_messages(node_id)
            await state.push_reply(node_id, Message(content, reply_to=pulled))
        assert count(path, "contents") == 2, "two echoes of the model, one other reply"
        replies = await state.get_replies(run_id, message_ids)
        assert [reply.content for reply in replies] == [sent, sent, model(3.0)]
        await state.ack_replies(run_id, message_ids[:2])
        assert count(path, "contents") == 2, "the third message still sends the model"
        await state.ack_replies(run_id, message_ids[2:])
    assert (count(path, "contents"), count(path, "replies")) == (0, 0)


async def test_a_loaded_content_is_mapped_not_held(path: Path, fake_clock: FakeClock) -> None:
    """Its arrays are views of a mapping (the page cache's), and equal to what was pushed."""
    odd = np.arange(3 * 2**20 + 5, dtype=np.uint8)  # more than a piece, not a multiple of it
    async with state_on(path, fake_clock) as state:
        node_id = await state.create_node(heartbeat_interval=math.inf)
        run_id = (await state.create_run({})).run_id
        content = RecordDict({"arrays": ArrayRecord({"w": odd}), "config": small()["config"]})
        await state.push_messages(run_id, [Message(content, node_id, "train")])
        del content
        (pulled,) = await state.pull_messages(node_id)
        loaded = pulled.content["arrays"]["w"]
        np.testing.assert_array_equal(loaded, odd)
        assert isinstance(backing(loaded), mmap.mmap)


def page_count(path: Path) -> int:
    """The database's size in pages, as its write-ahead log has it."""
    with sqlite3.connect(path) as connection:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
    connection.close()
    return int(pages)


def old_file(path: Path, version: int) -> sqlite3.Connection:
    """A database of schema ``version`` with run 5 (running) and node 9 (online) in it."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.create_function("sha256", 1, lambda data: hashlib.sha256(data).digest())
    for statement in [statement for migration in MIGRATIONS[:version] for statement in migration]:
        connection.execute(statement)
    config = pack_recorddict(RecordDict({"run_config": ConfigRecord({})}))
    connection.execute(
        "INSERT INTO runs (run_id, position, run_config, status) VALUES (5, 1, ?, 'running')",
        (config,),
    )
    connection.execute(
        "INSERT INTO nodes (node_id, heartbeat_interval, online_until) VALUES (9, 1e9, 9e99)"
    )
    return connection


async def test_a_version_2_file_moves_its_contents(path: Path, fake_clock: FakeClock) -> None:
    shared, other = pack_recorddict(small(1)), pack_recorddict(small(2))
    connection = old_file(path, 2)
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
    assert count(path, "contents") == 3, "the two messages' contents and the reply's"
    assert integrity == "ok"


async def test_a_version_4_file_moves_its_reply_contents(path: Path, fake_clock: FakeClock) -> None:
    connection = old_file(path, 4)
    sent = pack_recorddict(small(1))
    connection.execute(
        "INSERT INTO contents (sha256, data) VALUES (?, ?)", (hashlib.sha256(sent).digest(), sent)
    )
    now = fake_clock.now()
    replies = (("a", sent, None), ("b", pack_recorddict(small(2)), None), ("c", None, 5))
    for message_id, content, error_code in replies:
        connection.execute(
            "INSERT INTO messages (message_id, run_id, dst_node_id, message_type, group_id, "
            "created_at, ttl, expires_at, status, content_sha256) "
            "VALUES (?, 5, 9, 'train', '', ?, 600, ?, 'replied', ?)",
            (message_id, now, now + 600, hashlib.sha256(sent).digest()),
        )
        connection.execute(
            "INSERT INTO replies (message_id, reply_id, src_node_id, created_at, ttl, "
            "generated, error_code, error_reason, content) VALUES (?, ?, 9, ?, 600, ?, ?, ?, ?)",
            (
                message_id,
                f"reply-{message_id}",
                now,
                error_code is not None,
                error_code,
                None if error_code is None else "gone",
                content,
            ),
        )
    connection.execute("PRAGMA user_version = 4")
    connection.close()
    async with state_on(path, fake_clock) as state:
        got = await state.get_replies(5, ["a", "b", "c"])
        assert [reply.content for reply in got[:2]] == [small(1), small(2)]
        assert got[2].error.code == 5
        assert count(path, "contents") == 2, "the echo of the model is the model's content"
        await state.ack_replies(5, ["a", "b", "c"])
    with sqlite3.connect(path) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(replies)")]
        (integrity,) = connection.execute("PRAGMA integrity_check").fetchone()
        problems = connection.execute("PRAGMA foreign_key_check").fetchall()
    connection.close()
    assert "content" not in columns
    assert (integrity, problems) == ("ok", [])
    assert count(path, "contents") == 0


async def test_a_saved_context_is_streamed_and_mapped_too(
    path: Path, fake_clock: FakeClock
) -> None:
    """A ServerApp's state may hold a model: saved and loaded a piece at a time, replaced."""
    async with state_on(path, fake_clock) as state:
        run_id = (await state.create_run({})).run_id
        await state.save_context(run_id, 1, model(1.0))
        await state.save_context(run_id, 1, model(2.0))
        loaded = await state.load_context(run_id, 1)
        assert loaded == model(2.0)
        assert isinstance(backing(loaded["arrays"]["w"]), mmap.mmap)
        assert await state.load_context(run_id, 2) == RecordDict()
    assert count(path, "contexts") == 1
