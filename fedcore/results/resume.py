"""Going on with a run from its results directory: ``fedcore simulate --resume DIR``.

A run that died — killed, its machine rebooted, Ctrl-C — leaves its results directory
saying ``"running"`` (or how it failed) and, after each round it finished, a
checkpoint (:mod:`fedcore.results.checkpoint`). :func:`open_resumption` reads both
and sets the directory back to where the checkpoint is: the rounds after it that
``metrics.jsonl`` may already hold (a round whose line was written but whose
checkpoint was not) are dropped, since the resumed run does them again. The resumed
run then keeps writing the same directory: ``run.json`` lists each resumption under
``"resumed"``, ``log.txt`` and ``metrics.jsonl`` go on where they stopped.

What the run was (app, config, seed, nodes) comes from ``run.json``, so a resumed run
is the same run: with the same seed it ends with the model the uninterrupted run
would have, bit for bit, on whichever backend.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.errors import UsageError
from fedcore.results.checkpoint import read_checkpoint
from fedcore.results.directory import METRICS_FILE
from fedcore.results.reading import read_run_file
from fedcore.strategy.checkpoint import Checkpoint


@dataclass
class Resumption:
    """A results directory ready to go on from its checkpoint."""

    path: Path
    run: dict[str, Any]
    """``run.json`` as the run left it."""
    checkpoint: Checkpoint


def open_resumption(path: Path) -> Resumption:
    """The run in results directory ``path``, its metrics set back to its checkpoint.

    ``UsageError`` (a :class:`~fedcore.errors.CheckpointError` among them) when ``path``
    is not a results directory, its run completed, or it holds no usable checkpoint.
    """
    run = read_run_file(path)
    if run.get("status") == "completed":
        raise UsageError(f"the run in {str(path)!r} completed: there is nothing to resume")
    for key in ("seed", "nodes", "config"):
        if key not in run:
            raise UsageError(f"{str(path)!r}'s run.json has no {key!r}: it cannot be resumed")
    checkpoint = read_checkpoint(path)
    _cut_metrics(path / METRICS_FILE, checkpoint.server_round)
    return Resumption(path, run, checkpoint)


def _cut_metrics(path: Path, last_round: int) -> None:
    """Keep the header lines and the round lines up to ``last_round``; replaced whole."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line the killed run left half-written
        if isinstance(row, dict) and (row.get("round", 0) <= last_round):
            kept.append(line + "\n")
    temporary = path.with_name(f".{METRICS_FILE}.tmp")
    temporary.write_text("".join(kept), encoding="utf-8")
    os.replace(temporary, path)
