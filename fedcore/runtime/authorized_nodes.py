"""The link's list of authorized nodes: public keys, one per line, re-read on SIGHUP.

``fedcore serve --role link --authorized-nodes FILE`` admits only the nodes whose keys
the file lists (:class:`~fedcore.transport.fleet_gate.NodeGate`). A line is a key in
OpenSSH's one-line form (what ``fedcore keygen`` writes to ``OUT.pub``) or a PEM block
spread over lines; blank lines and lines starting with ``#`` are skipped. A file
with a line that is not a key is refused whole, naming the line: a typo never
silently locks a node out, nor lets the rest of the list go unread.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import anyio

from fedcore.errors import UsageError
from fedcore.transport.fleet_gate import NodeGate
from fedcore.wire.keys import PublicKey

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
