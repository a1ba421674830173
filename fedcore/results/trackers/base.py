"""What every tracker is given, and what it must do: :class:`Tracker` and :class:`TrackedRun`.

A tracker sees a run in three calls — :meth:`~Tracker.start` with what ran, then
:meth:`~Tracker.log_round` once per finished round, then :meth:`~Tracker.finish`
with how it ended — and nothing runtime-specific: a round is its line of
``metrics.jsonl`` (:func:`~fedcore.results.metrics.round_row`) flattened by
:func:`round_metrics`, so a simulation's round reports and a deployment's streamed
lines feed trackers alike. The names are the same in every tracker: ``replies``,
``failures``, ``seconds`` and ``<scope>/<key>`` for the round's metrics
(``server/accuracy``, ``evaluate/loss``, ``train/loss``): the slash is what
TensorBoard and W&B group charts by.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from fedcore.results.metrics import SCOPES

STATUSES = ("completed", "failed", "interrupted")
"""How a run can end (``run.json``'s ``status``), as :meth:`Tracker.finish` is told."""


@dataclass(frozen=True)
class TrackedRun:
    """A run as its trackers first see it.

    ``name`` names it in every tracker (the results directory's name); ``description``
    is ``run.json``'s opening content — app, config, seed, backend, nodes, resources;
    ``directory`` is the results directory, ``None`` with ``--no-save``; ``started`` is
    when the run began, in seconds since the epoch.
    """

    name: str
    description: Mapping[str, Any]
    directory: Path | None
    started: float

    @property
    def app(self) -> str:
        return str(self.description.get("app", "app"))


class Tracker(ABC):
    """One experiment tracker's side of a run. Called from one thread, in order.

    ``where`` is what followed ``NAME=`` in ``--track NAME=WHERE`` (each tracker says
    what it means), ``None`` for its default. A method that raises ends the tracker's
    part in the run, not the run: :mod:`~fedcore.results.trackers.feed` catches it.
    """

    name: ClassVar[str]

    def __init__(self, where: str | None) -> None:
        self.where = where

    @abstractmethod
    def start(self, run: TrackedRun) -> dict[str, str]:
        """Open the tracker's run and record the run's description; return where it
        records (for ``run.json``). Raise :class:`~fedcore.errors.TrackerError` to
        refuse the run (a bad location, no credentials)."""

    @abstractmethod
    def log_round(self, step: int, metrics: Mapping[str, float], at: float) -> None:
        """Record one finished round's :func:`round_metrics` at ``step`` (its number);
        ``at`` is when it ended, in seconds since the epoch, for trackers that keep it."""

    @abstractmethod
    def finish(self, status: str, at: float) -> None:
        """Close the tracker's run as ``status`` (one of :data:`STATUSES`), ended ``at``."""


def round_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A round line's numbers under the trackers' names; lists and text are left out."""
    metrics: dict[str, float] = {
        "replies": row["replies"],
        "failures": row["failures"],
        "seconds": row["elapsed"],
    }
    for scope in SCOPES:
        for key, value in row.get(scope, {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[f"{scope}/{key}"] = value
    return metrics


def flat_description(description: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``description`` as one level of text values, nested keys joined by dots
    (``config.lr``, ``resources.num_cpus``), for trackers whose parameters are flat
    text (MLflow's). Text stays as it is; anything else is written as JSON."""
    flat: dict[str, str] = {}
    for key, value in description.items():
        if isinstance(value, Mapping):
            flat.update(flat_description(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return flat
