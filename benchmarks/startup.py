"""Start-up: how long a ``fedcore`` command takes to answer ``--help``, as a whole process.

``python -m benchmarks.run startup help`` runs ``fedcore --help`` and each command's
``--help`` (``fedcore simulate --help``, ...) through the console script, as a user
types them, ``REPEATS`` times each, alternating with a bare ``python -c pass`` so that
both see the same moment of a shared machine; it reports each one's median wall time
and the bare interpreter's. The target is under ``TARGET`` seconds: a command imports
only what it needs (``fedcore --help`` nothing beyond click), and what the bare
interpreter takes is the part no change to fedcore can remove.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedcore.cli import COMMANDS
from fedcore.testing.deployment import FEDCORE

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 7
TARGET = 0.3


def _wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def case(variant: str) -> dict[str, Any]:
    """The ``help`` case's figures: median seconds per command line, and the bare floor's."""
    if variant != "help":
        raise SystemExit(f"startup has one case, 'help', not {variant!r}")
    lines = [["--help"], *([name, "--help"] for name in sorted(COMMANDS))]
    samples: dict[str, list[float]] = {" ".join(line): [] for line in lines}
    bare: list[float] = []
    for _ in range(REPEATS):
        for line in lines:
            bare.append(_wall([sys.executable, "-c", "pass"]))
            samples[" ".join(line)].append(_wall([str(FEDCORE), *line]))
    return {
        "repeats": REPEATS,
        "target_seconds": TARGET,
        "python_seconds": statistics.median(bare),
        "commands": {line: statistics.median(times) for line, times in samples.items()},
    }
