"""The SQL of the SQLite LinkState, kept in ``.sql`` files, and the code that loads it.

The schema and every statement live in files next to this module, so they can be read,
reviewed and tried in the ``sqlite3`` shell as they are; Python only binds parameters
and maps rows (:mod:`fedcore.state.sqlite`).

- ``migrations/NNNN_what.sql``: the schema, as numbered steps. ``PRAGMA user_version``
  counts the steps a database has applied; :func:`migrate` applies the missing ones.
  A step may call ``sha256(blob)`` (the digest, 32 bytes), which SQLite lacks:
  :func:`migrate` gives it to the connection.
- ``queries.sql``: the statements, each in a block opened by a ``-- name: NAME`` line,
  loaded into :data:`QUERIES`.

Both are package data, read with :mod:`importlib.resources`, once, at import.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable

from fedcore.errors import StateError

_NAME_LINE = re.compile(r"^-- name: (\S+)[ \t]*$", re.MULTILINE)
_MIGRATION_NAME = re.compile(r"(\d{4})_\w+\.sql")


def split_statements(script: str) -> list[str]:
    """The statements of ``script``, each complete, in order; comments stay with them.

    ``sqlite3.Connection.executescript`` would do this too, but it commits any open
    transaction first, and a migration must run inside one.
    """
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if any(line.strip() and not line.lstrip().startswith("--") for line in pending.splitlines()):
        raise ValueError(f"an SQL script ends inside a statement: {pending.strip()[:80]!r}")
    return statements


def _load_queries(text: str) -> dict[str, str]:
    pieces = _NAME_LINE.split(text)
    queries: dict[str, str] = {}
    for name, block in zip(pieces[1::2], pieces[2::2], strict=True):
        statements = split_statements(block)
        if name in queries or len(statements) != 1:
            raise ValueError(f"query {name!r} must be named once and hold one statement")
        queries[name] = statements[0]
    return queries


def _load_migrations(folder: Traversable) -> list[list[str]]:
    names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".sql"))
    for number, name in enumerate(names, start=1):
        match = _MIGRATION_NAME.fullmatch(name)
        if match is None or int(match.group(1)) != number:
            raise ValueError(f"migration {name!r} is not numbered {number:04d} in sequence")
    return [split_statements(folder.joinpath(name).read_text(encoding="utf-8")) for name in names]


_HERE = files(__name__)
QUERIES: Mapping[str, str] = _load_queries(_HERE.joinpath("queries.sql").read_text("utf-8"))
"""Every statement of ``queries.sql``, by name."""
MIGRATIONS: list[list[str]] = _load_migrations(_HERE.joinpath("migrations"))
"""The statements of each migration, in order: ``MIGRATIONS[0]`` is ``0001_*.sql``."""
SCHEMA_VERSION = len(MIGRATIONS)
"""The ``user_version`` of a database with every migration applied."""


def migrate(connection: sqlite3.Connection) -> None:
    """Bring the database up to :data:`SCHEMA_VERSION`, or leave it if it is there.

    One ``BEGIN IMMEDIATE`` transaction reads the version, applies what is missing and
    records the new version: when several processes open a fresh file at once, the
    first to take the write lock creates the schema, the others wait (up to the
    connection's busy timeout) and then find nothing to do. A migration that fails is
    rolled back whole. ``connection`` must not be in a transaction
    (``isolation_level=None``), and a database from a newer fedcore is refused.
    """
    connection.create_function("sha256", 1, _sha256, deterministic=True)
    connection.execute("BEGIN IMMEDIATE")
    try:
        (applied,) = connection.execute("PRAGMA user_version").fetchone()
        if applied > SCHEMA_VERSION:
            raise StateError(
                f"the database has schema version {applied}; this fedcore knows up to "
                f"{SCHEMA_VERSION}: open it with a newer fedcore"
            )
        for statements in MIGRATIONS[applied:]:
            for statement in statements:
                connection.execute(statement)
        if applied < SCHEMA_VERSION:
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
