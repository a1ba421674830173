"""The SQLite LinkState's message and reply contents, each stored once under its SHA-256.

A message row holds its metadata and status, which change as the message is leased,
renewed and answered; its content, often a model of megabytes, lives in the
``contents`` table (migration 0003; replies' since 0005), keyed by the SHA-256 of
its encoded bytes, so that a status change never writes the content again. A
ServerApp sends one content object to the many nodes of a round: it is encoded and
hashed once per push (the objects are told apart by identity) and stored once (by
hash); a node that echoes the model it was sent stores nothing new. Triggers delete
a content with the last message or reply that refers to it.

Contents go in and out a piece at a time (sqlite3's incremental blob I/O), never
as one ``bytes`` object: a stored content is read into a
:class:`~fedcore.wire.spool.Spool` and decoded from its mapping, so a 200 MB model
costs the link a piece of memory, not 200 MB, however many nodes pull it. While
anyone still holds a decoded content (the nodes pulling the same round meanwhile,
the fleet streaming it to them), the next load gets that same object, as every pull
of a message gets the pushed object in the memory state.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from fedcore.domain import Message, RecordDict
from fedcore.domain.fleet import Digest
from fedcore.errors import StateError
from fedcore.state.database import Database
from fedcore.wire import STORED_LIMITS, pack_recorddict_parts, unpack_recorddict


class SqliteContents:
    """Contents in the ``contents`` table of ``db``; used inside its transactions."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._decoded: weakref.WeakValueDictionary[bytes, RecordDict] = (
            weakref.WeakValueDictionary()
        )

    def store_messages(self, messages: Sequence[Message]) -> list[bytes]:
        """Store each distinct content of ``messages`` once; each message's content hash."""
        digests: dict[int, bytes] = {}
        for message in messages:
            if id(message.content) not in digests:
                digests[id(message.content)] = self.store(message.content)
        return [digests[id(message.content)] for message in messages]

    def store(self, content: RecordDict) -> bytes:
        """Store ``content`` unless it is stored already; its hash."""
        parts = pack_recorddict_parts(content)
        digest = Digest.of(parts)
        if self._db.execute("insert_content", sha256=digest.sha256, size=digest.size):
            self._db.write_blob("contents", "data", self._rowid(digest.sha256), parts)
        return digest.sha256

    def load(self, digest: bytes) -> RecordDict:
        """The content stored under ``digest``, read and decoded once while it is held."""
        content = self._decoded.get(digest)
        if content is None:
            data = self._db.read_blob("contents", "data", self._rowid(digest))
            content = self._decoded[digest] = unpack_recorddict(data, STORED_LIMITS)
        return content

    def _rowid(self, digest: bytes) -> int:
        row = self._db.row("content_rowid", sha256=digest)
        if row is None:  # a foreign key keeps every content a message refers to
            raise StateError(f"the content {digest.hex()} of a stored message is missing")
        rowid: int = row["rowid"]
        return rowid


def digest_of(content: RecordDict) -> bytes:
    """The hash ``content`` is stored under."""
    return Digest.of(pack_recorddict_parts(content)).sha256
