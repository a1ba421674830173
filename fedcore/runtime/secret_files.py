"""Secrets kept in files: the exec API's shared secret and the control API's token.

A secret goes in a file, readable by its owner only (mode 0600) — never on a
command line, where any local user could read it, and never into a log. The first
process to need a missing file creates it with a random secret; the others read it.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from fedcore.errors import UsageError

log = logging.getLogger(__name__)

MIN_SECRET_LENGTH = 32
"""Characters a secret has at least (a generated one has 43: 256 random bits)."""


def read_secret(path: Path, *, what: str) -> str:
    """The secret in ``path``; a new random one written there (mode 0600) if there is none.

    A link and an exec started at once on the same missing file agree on one secret:
    the file appears complete or not at all (written aside, then linked into place
    unless it exists by then). A secret shorter than :data:`MIN_SECRET_LENGTH` is
    refused with a ``UsageError``.
    """
    if not path.exists():
        _create_secret(path, what)
    return read_existing_secret(path, what=what)


def read_existing_secret(path: Path, *, what: str) -> str:
    """The secret in ``path``, which must exist: a client's copy of a server's secret.

    A missing, unreadable or short file is a ``UsageError`` naming it; one that others
    can read is taken, with a warning.
    """
    try:
        text = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the {what} file {path}: {exc}") from None
    if len(text) < MIN_SECRET_LENGTH:
        raise UsageError(
            f"the {what} in {path} is too short: at least {MIN_SECRET_LENGTH} characters "
            "(delete the file to have a random one made)"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the %s file %s is readable by others: chmod 600 it", what, path)
    return text


def _create_secret(path: Path, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    handle = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(aside, path)
        except FileExistsError:
            return  # made by someone else meanwhile: theirs is the secret
        log.info("a new %s was written to %s", what, path)
    finally:
        aside.unlink(missing_ok=True)
