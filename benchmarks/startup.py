"""Start-up: how long a ``fedcore`` command takes to answer ``--help``, as a whole process.

``python -m benchmarks.run startup help`` runs ``fedcore --help`` and each command's
``--help`` (``fedcore simulate --help``, ...) through the console script, as a user
types them, ``REPEATS`` times each, alternating with a bare ``python -c pass`` so that
both see the same moment of a shared machine; it reports each one's median wall time
and the bare interpreter's. The target is under ``TARGET`` seconds: a command imports
only what it needs (``fedcore --help`` nothing beyond click), and what the bare
interpreter takes is the part no change to fedcore can remove.

:func:`simulate_cli` is the other way a user meets start-up: ``fedcore simulate`` of
a workload's app as a whole process, start-up, workers and all (W2 ``cli``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FEDCORE = Path(sys.executable).parent / "fedcore"
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
    # Here, not at the top: W2's app module imports this one, in every pool worker.
    from fedcore.cli import COMMANDS

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


def simulate_cli(target: str, nodes: int) -> None:
    """``fedcore simulate TARGET --nodes NODES --seed 0 --quiet`` from the repository root."""
    argv = [str(FEDCORE), "simulate", target, "--nodes", str(nodes), "--seed", "0", "--quiet"]
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
