"""The ready file: what a server writes once it listens, so that others can find it.

``fedcore serve --ready-file PATH`` writes, once every listener is bound, a small JSON
object: the server's pid and, per listener, the address it really listens on (with
the port the system chose for port 0). It is written to a temporary file in the same
directory and renamed into place, so a reader that sees the file sees all of it. A
test starts a server, waits (with a deadline) for the file to appear, and reads the
ports from it — no fixed ports, no sleeping, no parsing of log lines.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.errors import DecodeError
from fedcore.runtime.addresses import Address, parse_address


def write_ready_file(path: Path, listeners: Mapping[str, Address]) -> None:
    """Atomically write ``{"pid": …, "listeners": {name: "host:port"}}`` to ``path``."""
    document = {"pid": os.getpid(), "listeners": {n: str(a) for n, a in listeners.items()}}
    replace_file(path, json.dumps(document))


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole: to a temporary file beside it, synced, then renamed
    over it, so that a reader sees the old file or all of the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_ready_file(path: Path) -> tuple[int, dict[str, Address]]:
    """The pid and listener addresses in a ready file; ``DecodeError`` if it is not one."""
    try:
        document: Any = json.loads(path.read_text(encoding="utf-8"))
        pid, listeners = document["pid"], document["listeners"]
        if not isinstance(pid, int) or not isinstance(listeners, dict):
            raise TypeError("pid must be an int and listeners an object")
        return pid, {
            str(name): parse_address(text, what=f"listener {name}")
            for name, text in listeners.items()
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise DecodeError(f"{path} is not a fedcore ready file: {exc}") from None
