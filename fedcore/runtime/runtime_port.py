"""The link's runtime port, kept in its work directory so that a restart keeps it.

A ServerApp process is told the runtime API's address once, when it starts, and it
outlives its link (a ``kill -9``; a Ctrl-C too, see :mod:`fedcore.roles.exec.launcher`):
it keeps calling that address until the link is back. The runtime API listens on
port 0 by default, a port the system picks, so a restarted link would listen
elsewhere and its runs in progress would be lost. So the link writes the port it
bound to ``runtime.port`` in its work directory, and a link started on that
directory with port 0 binds the port written there first. Only when that port is
taken (by another program, since) does it take a new one, saying that the
ServerApps still running from before cannot reach it.

The work directory, not the database, keeps it: the port belongs to this machine's
link process, as the control token and the bundle cache beside it do, and a
``:memory:`` link keeps one too.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedcore.runtime.addresses import Address
from fedcore.runtime.ready import replace_file

log = logging.getLogger(__name__)

RUNTIME_PORT_FILE = "runtime.port"
"""The file in the link's work directory that holds the runtime API's last port."""


def runtime_port_file(work_dir: Path) -> Path:
    return work_dir / RUNTIME_PORT_FILE


def preferred_runtime_address(address: Address, work_dir: Path) -> Address:
    """Where to serve the runtime API: ``address`` itself, unless it asks for port 0
    and the work directory holds the port an earlier start bound."""
    if address.port != 0:
        return address
    path = runtime_port_file(work_dir)
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return address
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s is unreadable (%s): the runtime API takes a new port", path, exc)
        return address
    if not text.isdigit() or not 0 < int(text) < 65536:
        log.warning("%s holds no port (%r): the runtime API takes a new port", path, text[:20])
        return address
    return Address(address.host, int(text))


def remember_runtime_port(work_dir: Path, port: int) -> None:
    """Write ``port`` as the runtime API's port, atomically (a reader sees all of it)."""
    replace_file(runtime_port_file(work_dir), f"{port}\n")
