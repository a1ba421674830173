"""``--out DIR`` and ``--no-save``: where a command keeps a run's results directory.

``fedcore simulate`` and ``fedcore run --stream`` keep the same directory
(:mod:`fedcore.results`), so they take the same two options, from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from fedcore.results import RESULTS_ENV

F = TypeVar("F", bound=Callable[..., object])


def results_dir_options(when: str = "", named_by: str = "<seed>") -> Callable[[F], F]:
    """The two options, their help starting with ``when`` (say, "With --stream: ");
    ``named_by`` is what ends a directory's name after ``<UTC time>-<app>-``."""
    keep = f"{when}keep" if when else "Keep"
    out = click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("results"),
        show_default=True,
        envvar=RESULTS_ENV,
        show_envvar=True,
        help=f"{keep} the run's results directory under this one: run.json, "
        "metrics.jsonl, log.txt, model.npz (when main returns a model) and summary.png, "
        f"in <UTC time>-<app>-{named_by}/.",
    )
    no_save = click.option("--no-save", is_flag=True, help=f"{keep} no results directory.")

    def decorate(command: F) -> F:
        return out(no_save(command))

    return decorate
