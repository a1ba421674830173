"""Plain handlers' daemon threads are counted, so a run's end can wait for those still
running before the interpreter's exit would end them under a C++ library.

The count is the process's: the check runs in a fresh interpreter, where no other
test has left a handler behind.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """\
import threading

import anyio

from fedcore.apps.handler_threads import handlers_running, run_in_thread, wait_for_handlers

release, started = threading.Event(), threading.Event()


def handler():
    started.set()
    release.wait()


async def main():
    assert await anyio.to_thread.run_sync(wait_for_handlers, 5.0) == 0
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(run_in_thread, handler)
            await anyio.to_thread.run_sync(started.wait)
            scope.cancel()  # the caller stops waiting: the thread goes on
    assert handlers_running() == 1
    assert await anyio.to_thread.run_sync(wait_for_handlers, 0.05) == 1
    release.set()
    assert await anyio.to_thread.run_sync(wait_for_handlers, 30.0) == 0
    assert await run_in_thread(lambda: "again") == "again"
    assert handlers_running() == 0
    print("ok")


anyio.run(main)
"""


def test_a_running_handler_is_counted_until_it_returns_even_once_abandoned() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
