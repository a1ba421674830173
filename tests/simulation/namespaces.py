"""A fresh network namespace whose only interface is loopback, for Ray clusters in tests.

Ray advertises the machine's own address even when told ``127.0.0.1``, and two Ray
nodes, a driver and a would-be cluster all on one machine then talk over it. Inside a
namespace of its own, with loopback the only interface, every address Ray finds is
``127.0.0.1``, and nothing it sends leaves the namespace.

A holder process (``unshare --net``, or ``unshare -rn`` where this user is not root:
a user namespace too, in which this user may configure the network) brings loopback
up and waits on its stdin; every process of the test then enters its namespace with
``nsenter``, and is the test's own child, ended by its pid. Closing the namespace ends
the holder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from types import TracebackType
from typing import Self

import pytest

_HOLDER = """\
import fcntl, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack("16sH", b"lo", 0)
    flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
print("up", flush=True)
sys.stdin.read()
"""


class Namespace:
    """A network namespace with loopback up; :meth:`command` runs a command inside it."""

    def __init__(self) -> None:
        for tool in ("unshare", "nsenter"):
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} (util-linux) is not installed")
        self._root = os.geteuid() == 0
        unshare = ["unshare", "--net"] if self._root else ["unshare", "-rn"]
        self._holder = subprocess.Popen(
            [*unshare, sys.executable, "-c", _HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "up":
            _, error = self._holder.communicate(timeout=10)
            pytest.skip(f"cannot make a network namespace here: {error.strip()[-300:]}")

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``nsenter`` execs it: same pid)."""
        enter = ["nsenter", "-t", str(self._holder.pid), "-n"]
        if not self._root:
            enter += ["-U", "--preserve-credentials"]
        return [*enter, "--", *argv]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._holder.kill()
        self._holder.communicate(timeout=10)
