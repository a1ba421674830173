"""Secrets kept in files: the exec API's shared secret, the control API's token, node keys.

A secret goes in a file, readable by its owner only (mode 0600) — never on a
command line, where any local user could read it, and never into a log. The first
process to need a missing file creates it with a random secret; the others read it.
A node's signing key (:mod:`fedcore.auth.keys`) is kept the same way: made on the
node's first start in its work directory, or by ``fedcore keygen``.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from fedcore.errors import UsageError

if TYPE_CHECKING:  # imported where used: reading a token needs no cryptography
    from fedcore.auth.keys import KeyKind, NodeKey

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
    if _write_new(path, (secrets.token_urlsafe(32) + "\n").encode("utf-8"), 0o600):
        log.info("a new %s was written to %s", what, path)


def _write_new(path: Path, data: bytes, mode: int) -> bool:
    """Write ``data`` to ``path`` with ``mode`` unless it exists; whether this call wrote it.

    The file appears complete or not at all: written aside, then linked into place.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    handle = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(aside, path)
        except FileExistsError:
            return False  # made by someone else meanwhile: theirs stands
        return True
    finally:
        aside.unlink(missing_ok=True)


def read_node_key(path: Path) -> NodeKey:
    """The node key in ``path``; a new Ed25519 key written there (mode 0600, its directory
    made 0700) if there is none.

    A key file that its group or others may read or write is refused (``UsageError``),
    as ssh refuses such a private key: whoever can read it can register and sign as
    this node, and fetch every run and bundle the node may see.
    """
    from fedcore.auth.keys import NodeKey

    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if _write_new(path, NodeKey.generate().pem(), 0o600):
            log.info("a new node key was written to %s", path)
    try:
        data = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise UsageError(f"cannot read the node key file {path}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(
            f"the node key file {path} is open to others (mode {mode:04o}): whoever reads it "
            f"can sign as this node; chmod 600 {path}"
        )
    try:
        return NodeKey.from_pem(data)
    except UsageError as exc:
        raise UsageError(f"the node key file {path}: {exc}") from None


def write_key_pair(out: Path, kind: KeyKind = "ed25519") -> tuple[Path, Path]:
    """A new node key in ``OUT.key`` (mode 0600) and its public key in ``OUT.pub``; both paths.

    Refuses (``UsageError``) to replace either file.
    """
    from fedcore.auth.keys import NodeKey

    private, public = out.with_name(out.name + ".key"), out.with_name(out.name + ".pub")
    for path in (private, public):
        if path.exists():
            raise UsageError(f"{path} exists: keygen does not replace a key")
    key = NodeKey.generate(kind)
    if not _write_new(private, key.pem(), 0o600):
        raise UsageError(f"{private} appeared meanwhile: keygen does not replace a key")
    comment = f"fedcore-node {out.name}"
    if not _write_new(public, (key.public.openssh(comment) + "\n").encode("ascii"), 0o644):
        raise UsageError(f"{public} appeared meanwhile: keygen does not replace a key")
    return private, public
