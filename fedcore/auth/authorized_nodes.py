"""The link's list of authorized nodes: public keys, one per line, re-read on SIGHUP.

``fedcore serve --role link --authorized-nodes FILE`` admits only the nodes whose keys
the file lists (:class:`~fedcore.auth.fleet_gate.NodeGate`). A line is a key in
OpenSSH's one-line form (what ``fedcore keygen`` writes to ``OUT.pub``) or a PEM block
spread over lines; blank lines and lines starting with ``#`` are skipped. A file
with a line that is not a key is refused whole, naming the line: a typo never
silently locks a node out, nor lets the rest of the list go unread.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
from pathlib import Path

import anyio

from fedcore.auth.fleet_gate import NodeGate
from fedcore.auth.keys import PublicKey
from fedcore.errors import UsageError

log = logging.getLogger(__name__)


def read_authorized_nodes(path: Path) -> list[PublicKey]:
    """The keys ``path`` lists; ``UsageError`` naming the first line that is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the authorized nodes file {path}: {exc}") from None
    keys: list[PublicKey] = []
    pem: list[str] = []
    start = 0
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if pem or text.startswith("-----BEGIN"):
            pem.append(text)
            start = start or number
            if text.startswith("-----END"):
                keys.append(_parsed(path, start, "\n".join(pem)))
                pem, start = [], 0
            continue
        if text and not text.startswith("#"):
            keys.append(_parsed(path, number, text))
    if pem:
        raise UsageError(f"{path}:{start}: a PEM key with no END line")
    return keys


def _parsed(path: Path, number: int, text: str) -> PublicKey:
    try:
        return PublicKey.parse(text)
    except UsageError as exc:
        raise UsageError(f"{path}:{number}: {exc}") from None


class AuthorizedNodesFile:
    """The list in ``path``, kept in force in ``gate``: what ``fedcore nodes add/remove`` edit.

    Each change rewrites the file whole (written aside, then renamed over it, so that a
    reader never sees half a list) and hands the new list to the gate at once.
    """

    def __init__(self, path: Path, gate: NodeGate) -> None:
        self._path = path
        self._gate = gate

    def keys(self) -> list[str]:
        return [key.openssh() for key in read_authorized_nodes(self._path)]

    def add(self, public_key: str) -> list[str]:
        key = PublicKey.parse(public_key)
        keys = read_authorized_nodes(self._path)
        if key not in keys:
            text = self._path.read_text(encoding="utf-8")
            separator = "" if not text or text.endswith("\n") else "\n"
            self._write(f"{text}{separator}{key.openssh(_comment(public_key))}\n")
        return self._enforce()

    def remove(self, public_key: str) -> list[str]:
        key = PublicKey.parse(public_key)
        kept = [
            line
            for line in self._path.read_text(encoding="utf-8").splitlines()
            if not _is_line_of(line, key)
        ]
        self._write("".join(f"{line}\n" for line in kept))
        listed = self._enforce()
        if key.openssh() in listed:
            raise UsageError(
                f"{self._path} lists this key as a PEM block: take it out there, and send the "
                "link SIGHUP"
            )
        return listed

    def _enforce(self) -> list[str]:
        keys = read_authorized_nodes(self._path)
        self._gate.authorize(keys)
        return [key.openssh() for key in keys]

    def _write(self, text: str) -> None:
        aside = self._path.with_name(f".{self._path.name}.{secrets.token_hex(8)}")
        try:
            aside.write_text(text, encoding="utf-8")
            os.chmod(aside, self._path.stat().st_mode & 0o777)
            os.replace(aside, self._path)
        finally:
            aside.unlink(missing_ok=True)


def _comment(public_key: str) -> str:
    """The comment of a key given in OpenSSH form (its third field), else none."""
    fields = public_key.split()
    return " ".join(fields[2:]) if fields and not public_key.startswith("-----") else ""


def _is_line_of(line: str, key: PublicKey) -> bool:
    """Whether ``line`` of the file (a one-line key) is ``key``; PEM blocks are kept whole."""
    text = line.strip()
    if not text or text.startswith(("#", "-----")):
        return False
    try:
        return PublicKey.parse(text) == key
    except UsageError:
        return False


async def reload_on_hangup(path: Path, gate: NodeGate) -> None:
    """Read ``path`` into ``gate`` again at each SIGHUP, until cancelled.

    A file that no longer reads is logged and the list in force is kept.
    """
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                keys = read_authorized_nodes(path)
            except UsageError as exc:
                log.error("kept the authorized nodes in force: %s", exc)
                continue
            gate.authorize(keys)
            log.info("authorized nodes re-read from %s: %d keys", path, len(keys))
