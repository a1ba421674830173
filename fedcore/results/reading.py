"""Reading a results directory back: :func:`read_run` and :class:`RunResults`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcore.errors import UsageError
from fedcore.results.directory import METRICS_FILE, RUN_FILE
from fedcore.results.metrics import SCOPES


@dataclass
class RunResults:
    """One run's record: ``run.json`` as written, and its round lines in order."""

    path: Path
    run: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def metric_names(self) -> list[str]:
        """Every ``scope.key`` with a number in some round: ``server.accuracy``, …"""
        names: dict[str, None] = {}
        for scope in SCOPES:
            for row in self.rounds:
                for key, value in row.get(scope, {}).items():
                    if _number(value):
                        names[f"{scope}.{key}"] = None
        return list(names)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """The rounds that have metric ``name`` (``scope.key``) and its values there."""
        scope, _, key = name.partition(".")
        rounds, values = [], []
        for row in self.rounds:
            value = row.get(scope, {}).get(key)
            if _number(value):
                rounds.append(int(row["round"]))
                values.append(float(value))
        return rounds, values


def read_run_file(path: Path) -> dict[str, Any]:
    """``run.json`` of results directory ``path``; ``UsageError`` if it is not one."""
    try:
        run = json.loads((path / RUN_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"{str(path)!r} is not a results directory: it has no {RUN_FILE}"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {str(path / RUN_FILE)!r}: {exc}") from None
    return run if isinstance(run, dict) else {}


def read_run(path: Path) -> RunResults:
    """The run recorded in ``path``; ``UsageError`` if it is not a results directory."""
    run = read_run_file(path)
    rounds: list[dict[str, Any]] = []
    metrics = path / METRICS_FILE
    lines = metrics.read_text(encoding="utf-8").splitlines() if metrics.exists() else []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            if number == len(lines):  # a run killed mid-write: the rounds before it stand
                break
            raise UsageError(f"{str(metrics)!r} line {number} is not JSON") from None
        if isinstance(row, dict) and "round" in row:
            rounds.append(row)
    return RunResults(path, run, rounds)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
