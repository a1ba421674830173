"""Experiment trackers: a run's config and every round's metrics, in MLflow, TensorBoard or W&B.

``fedcore simulate --track NAME[=WHERE]`` (``fc.simulate(track=[...])``) adds a run's
record to a tracker besides its results directory, under the results directory's
name; what ``WHERE`` means for each is in docs/cli.md (``--track``). Each tracker is an
optional extra whose library is imported only when it is asked for, by its module here
(:mod:`.mlflow`, :mod:`.tensorboard`, :mod:`.wandb`), so that fedcore needs none of
them. The interface they share is :mod:`.base`; :mod:`.feed` calls them off the event
loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedcore.errors import TrackerError

if TYPE_CHECKING:
    from fedcore.results.trackers.base import Tracker

TRACKERS = ("mlflow", "tensorboard", "wandb")
"""The trackers ``--track`` knows, each an extra of the same name (``fedcore[mlflow]``)."""


def create_trackers(specs: Sequence[str]) -> list[Tracker]:
    """The trackers ``specs`` (``NAME`` or ``NAME=WHERE`` each) ask for, not yet started.

    :class:`~fedcore.errors.TrackerError` for an unknown name, one asked for twice, or
    one whose library is not installed.
    """
    if isinstance(specs, str):
        specs = [specs]
    trackers: list[Tracker] = []
    for spec in specs:
        name, _, where = spec.partition("=")
        name = name.strip().lower()
        if name not in TRACKERS:
            known = ", ".join(TRACKERS)
            raise TrackerError(f"unknown tracker {name!r} in {spec!r}; choose from: {known}")
        if any(tracker.name == name for tracker in trackers):
            raise TrackerError(f"the {name} tracker is asked for twice")
        try:
            module = importlib.import_module(f"fedcore.results.trackers.{name}")
        except ImportError as exc:
            raise TrackerError(
                f"the {name} tracker needs its library ({exc}): pip install 'fedcore[{name}]'"
            ) from None
        trackers.append(module.TRACKER(where.strip() or None))
    return trackers
