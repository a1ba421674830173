"""The JSON lines a run's metrics are written as: one header per run, one line per round.

``metrics.jsonl`` in a results directory and ``--metrics-out`` share the form, so
one reader serves both. A round's line has a ``round`` key; a run's header has a
``run`` key instead, so a reader tells them apart in a file several runs appended to.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from fedcore.strategy.result import RoundReport


def run_header(
    run_id: int, seed: int | None, config: dict[str, Any], started: float
) -> dict[str, Any]:
    """The line that opens a run's metrics (``seed`` is ``None`` for a deployed run
    that has none)."""
    return {
        "run": run_id,
        "seed": seed,
        "config": config,
        "started": iso_time(started),
        "fedcore": fedcore_version(),
    }


def round_row(report: RoundReport) -> dict[str, Any]:
    """One finished round: replies, failures by label, seconds, and its three metric scopes;
    ``"stopped_early": true`` on the round after which ``should_stop`` ended the run."""
    row = asdict(report)
    line: dict[str, Any] = {
        "round": row.pop("server_round"),
        "num_rounds": row["num_rounds"],
        "replies": report.replies,
        "failures": report.failures,
        "failures_by_label": _merged(report.train_failures, report.evaluate_failures),
        "elapsed": row["elapsed"],
        "train": row["train_metrics"],
        "evaluate": row["evaluate_metrics"],
        "server": row["server_metrics"],
    }
    if report.stopped_early:  # only the line of the round should_stop ended the run after
        line["stopped_early"] = True
    return line


SCOPES = ("server", "evaluate", "train")
"""A round line's metric scopes, in the order pictures and tables show them."""


def iso_time(seconds: float) -> str:
    """Seconds since the epoch as UTC ISO 8601, to the second."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def fedcore_version() -> str:
    try:
        return importlib.metadata.version("fedcore")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def _merged(*tallies: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for tally in tallies:
        for label, count in tally.items():
            merged[label] = merged.get(label, 0) + count
    return merged
