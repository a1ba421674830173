"""A Deployment kills what it started even when its own process is told to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.testing.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

HOLDER = """
import sys, time
from pathlib import Path
from fedcore.testing.deployment import Deployment
with Deployment(Path(sys.argv[1])) as deployment:
    link = deployment.start_link()
    print(link.process.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_sigterm_to_its_holder_ends_every_server_it_started(tmp_path: Path) -> None:
    link_pid = 0
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            link_pid = int(holder.stdout.readline())
            assert _alive(link_pid)
            holder.send_signal(signal.SIGTERM)
            assert holder.wait(timeout=60) == 128 + signal.SIGTERM
            wait_until(
                lambda: not _alive(link_pid), 30, "the link to end with the process that started it"
            )
        finally:
            holder.kill()
            if link_pid and _alive(link_pid):
                os.kill(link_pid, signal.SIGKILL)
