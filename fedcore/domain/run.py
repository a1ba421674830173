"""Run: one execution of an app on a federation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedcore.domain.lifecycle import RunStatus

MODEL_ARTIFACT = "model"
"""The artifact a run keeps its final model under: ``{"arrays": ArrayRecord}``, what
``main`` returned (an ArrayRecord, or a strategy's ``Result``)."""
CHECKPOINT_ARTIFACT = "checkpoint"
"""The artifact a run's ServerApp keeps its last round checkpoint under, while its exec
may start it again (:mod:`fedcore.strategy.checkpoint`)."""


@dataclass
class Run:
    """A run's identity, configuration and status.

    ``seed`` makes node sampling reproducible: the simulation's ``--seed`` when one
    was given, else the run config's ``seed`` key, else ``None`` (unseeded).
    """

    run_id: int
    run_config: dict[str, Any] = field(default_factory=dict)
    status: RunStatus = RunStatus.PENDING
    reason: str = ""
    seed: int | None = None
    bundle_hash: str = ""
    """SHA-256 (hex) of the run's app bundle; empty for a simulation, which has none."""
    created_at: float = 0.0
    """When the run was created, on the LinkState's clock."""
    finished_at: float | None = None
    """When the run reached ``finished:*``, on the LinkState's clock; ``None`` before."""
    round_timeout: float | None = None
    """Seconds a strategy's round phase may wait for replies when the strategy was given
    no ``round_timeout`` of its own (``fedcore simulate --round-timeout``); ``None``: the
    strategies' default. Not stored: the runtime that starts the ServerApp sets it."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line a run's ServerApp logged, numbered from 1 in the order the link got them."""

    seq: int
    time: float
    text: str


@dataclass(frozen=True, slots=True)
class MetricsLine:
    """One line of a run's metrics, numbered from 1 in the order the link got them.

    ``document`` is a JSON object, as ``metrics.jsonl`` of a results directory holds
    it (:mod:`fedcore.results.metrics`): a run's header (``"run"`` key) or a finished
    round (``"round"`` key).
    """

    seq: int
    document: dict[str, Any]
