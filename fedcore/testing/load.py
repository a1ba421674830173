"""CPU-bound busy processes, to test a deployment on a machine that is not quiet.

A link, its nodes and their ServerApps share machines with other work; a test that
passes only on an idle machine proves little. :func:`busy_processes` starts
processes that each spin one core until a deadline (so none outlives a test that
forgets it), and ends them by pid on leaving. From a shell, beside any command::

    python -m fedcore.testing.load --processes 2 --seconds 1800 &
    make test
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click

_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_processes(count: int = 2, *, seconds: float = 600.0) -> Iterator[list[int]]:
    """``count`` processes spinning a core each for at most ``seconds``; their pids."""
    processes = [
        subprocess.Popen([sys.executable, "-c", _SPIN.format(seconds=seconds)])
        for _ in range(count)
    ]
    try:
        yield [process.pid for process in processes]
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()


@click.command()
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Each process stops by itself after this long.",
)
def main(processes: int, seconds: float) -> None:
    """Keep PROCESSES cores busy for SECONDS (or until interrupted or terminated)."""
    # A SIGTERM (`kill PID`) ends the busy processes too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with busy_processes(processes, seconds=seconds) as pids:
        click.echo(f"busy processes: {' '.join(map(str, pids))}", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(seconds)


if __name__ == "__main__":
    main()
