"""The Weights & Biases tracker (``--track wandb[=PROJECT]``, the ``[wandb]`` extra).

A run of its own (``reinit="create_new"``), so that a simulation inside a script or a
notebook leaves the caller's ``wandb.run`` alone. W&B's settings are its own:
``WANDB_MODE=offline`` keeps the run on disk for ``wandb sync`` later, and needs no
account and no network; ``disabled`` records nothing. The project is ``PROJECT``,
else ``$WANDB_PROJECT``, else the app's name; the run is named after the results
directory, and W&B's files go in it (``<results dir>/wandb/``; without one, where
W&B puts them: ``$WANDB_DIR``, else here). The config is the run's description as
``run.json`` has it; each round's metrics are logged at step = round; the run
finishes with exit code 0 when it completed, 1 when it failed, 255 when interrupted.
W&B's console capture is off: the run's log stays fedcore's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import wandb

from fedcore.results.trackers.base import TrackedRun, Tracker

_EXIT_CODE = {"completed": 0, "failed": 1, "interrupted": 255}


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, run: TrackedRun) -> dict[str, str]:
        project = self.where or os.environ.get("WANDB_PROJECT") or run.app
        self._run = wandb.init(
            project=project,
            name=run.name,
            dir=None if run.directory is None else str(run.directory),
            config=dict(run.description),
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        where = {"project": project, "run_id": self._run.id, "mode": self._run.settings.mode}
        if not self._run.disabled:  # WANDB_MODE=disabled writes nothing anywhere
            where["dir"] = str(self._run.settings.sync_dir)
        if not (self._run.disabled or self._run.offline) and self._run.url:
            where["url"] = self._run.url
        return where

    def log_round(self, step: int, metrics: Mapping[str, float], at: float) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, status: str, at: float) -> None:
        self._run.finish(exit_code=_EXIT_CODE[status])


TRACKER = WandbTracker
