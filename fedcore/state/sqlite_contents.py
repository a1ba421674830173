"""The SQLite LinkState's message contents, each stored once under its SHA-256.

A message row holds its metadata and status, which change as the message is leased,
renewed and answered; its content, often a model of megabytes, lives in the
``contents`` table (migration 0003), keyed by the SHA-256 of its encoded bytes, so
that a status change never writes the content again. A ServerApp sends one content
object to the many nodes of a round: it is encoded and hashed once per push (the
objects are told apart by identity) and stored once (by hash). A trigger deletes a
content with the last message that refers to it.

Reading is the mirror image: a pull reads and decodes each content it hands out
once, and while anyone still holds the decoded content (the nodes pulling the same
round meanwhile, the fleet encoding it for them), the next pull gets that same object,
as every pull of a message gets the pushed object in the memory state.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence

from fedcore.domain import Message, RecordDict
from fedcore.errors import StateError
from fedcore.state.database import Database
from fedcore.wire import pack_recorddict, unpack_recorddict


class SqliteContents:
    """Message contents in the ``contents`` table of ``db``; used inside its transactions."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._decoded: weakref.WeakValueDictionary[bytes, RecordDict] = (
            weakref.WeakValueDictionary()
        )

    def store(self, messages: Sequence[Message]) -> list[bytes]:
        """Store each distinct content of ``messages`` once; each message's content hash."""
        digests: dict[int, bytes] = {}
        for message in messages:
            if id(message.content) not in digests:
                data = pack_recorddict(message.content)
                digest = hashlib.sha256(data).digest()
                self._db.execute("insert_content", sha256=digest, data=data)
                digests[id(message.content)] = digest
        return [digests[id(message.content)] for message in messages]

    def load(self, digest: bytes) -> RecordDict:
        """The content stored under ``digest``, read and decoded once while it is held."""
        content = self._decoded.get(digest)
        if content is None:
            row = self._db.row("content_data", sha256=digest)
            if row is None:  # a foreign key keeps every content a message refers to
                raise StateError(f"the content {digest.hex()} of a stored message is missing")
            content = self._decoded[digest] = unpack_recorddict(row["data"])
        return content
