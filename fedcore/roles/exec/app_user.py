"""Running app processes as another user (``fedcore serve --app-user USER``).

A ServerApp or ClientApp runs code whoever submitted the run wrote. Under its
starter's own user it can read every file its starter can: the link's database,
other runs' output and bundles, a node's signing key. (Not their memory: every role
and app process is non-dumpable, :mod:`fedcore.non_dumpable`.) Under a user of its
own it can read none of that — every file the roles write is private to their user
(mode 0600, directories 0700) — and it cannot signal or trace its starter. A role
whose app processes run as itself says so once, at start (:func:`same_user_warning`).

Changing user takes root, so an exec not running as root refuses the flag, as it
does an unknown user and ``root`` itself (which would isolate nothing). The app's
files are the exception the app user must read: each launch gets a private copy of
the unpacked bundle in a fresh directory of the system's temporary space (mode
0700, owned by the app user), which is also the process's working directory and
``TMPDIR``, and which is removed when the process has ended. The app user must be
able to run the exec's Python and read its packages (a virtual environment under
``/root`` is not readable by others).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedcore.errors import UsageError

_BECOME = (
    "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); "
    "os.setuid(int(sys.argv[1])); os.execvp(sys.argv[3], sys.argv[3:])"
)
"""What :meth:`AppUser.command` runs: take the user's ids, then become the command."""

APP_COPY_PREFIX = "fedcore-app-"
"""The prefix of each launch's private directory in the system's temporary space."""


@dataclass(frozen=True)
class AppUser:
    """The user app processes run as: a name, its ids and its home."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def named(cls, name: str) -> AppUser:
        """The user ``name``; :class:`UsageError` when this process cannot switch to it."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UsageError(f"--app-user {name}: no such user on this machine") from None
        if entry.pw_uid == 0:
            raise UsageError(f"--app-user {name} is root: that isolates nothing")
        if os.geteuid() != 0:
            raise UsageError(
                f"--app-user {name} needs the exec to run as root (it runs as uid "
                f"{os.geteuid()}), to start processes as another user"
            )
        return cls(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def environment(self) -> dict[str, str]:
        """Who the process is, in its environment (not the exec's user's HOME)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def command(self, command: list[str]) -> list[str]:
        """``command``, run as this user: a Python that takes this user's ids (its primary
        group, no other) and then executes ``command`` in its place, keeping its pid and
        descriptors. Not ``user=``/``group=`` of the subprocess: uvloop, the roles' event
        loop, takes neither, and anyio passes no ``preexec_fn``."""
        return [sys.executable, "-I", "-S", "-c", _BECOME, str(self.uid), str(self.gid), *command]

    def private_copy(self, app_dir: Path) -> Path:
        """A copy of ``app_dir`` only this user (and root) can read; remove it with
        :func:`remove_copy`. Blocking: call it in a thread."""
        root = Path(tempfile.mkdtemp(prefix=APP_COPY_PREFIX, dir=_system_temp()))
        try:
            copy = root / "app"
            shutil.copytree(app_dir, copy, symlinks=True)
            for path in (root, *copy.rglob("*"), copy):
                os.lchown(path, self.uid, self.gid)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return copy


def remove_copy(copy: Path) -> None:
    """Remove a launch's private directory (the parent of its app copy)."""
    shutil.rmtree(copy.parent, ignore_errors=True)


def _system_temp() -> str:
    """The machine's temporary space: not ``tempfile``'s default, which a link points at
    its own private spool directory."""
    return os.environ.get("TMPDIR") or "/tmp"


def same_user_warning(apps: str, reachable: list[str], remedy: str) -> str:
    """The one warning a role logs at start when its app processes run as its own user.

    ``apps``: which processes ("ServerApp", "ClientApp"); ``reachable``: what of the
    role's such a process can then read; ``remedy``: how to keep it out.
    """
    return (
        f"{apps} processes run as this process's user (uid {os.geteuid()}): the code of any "
        f"run can read {', '.join(reachable)}, and signal (though not read the memory of) "
        f"this process and other runs' {apps} processes. {remedy}"
    )
