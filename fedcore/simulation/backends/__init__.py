"""Simulation backends; ``create_backend`` picks one by name.

A backend's module is imported when it is chosen, and the package imports none: the
process pool's workers live here (:mod:`.worker`), and need neither backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedcore.errors import UsageError

if TYPE_CHECKING:
    from fedcore.apps.loading import LoadedApp
    from fedcore.clock import Clock
    from fedcore.simulation.backends.base import Backend
    from fedcore.simulation.resources import Resources

BACKENDS = ("process", "inline")
DEFAULT_BACKEND = "process"


def create_backend(
    name: str,
    app: LoadedApp,
    resources: Resources,
    clock: Clock,
    *,
    system: Resources | None = None,
    max_workers: int | None = None,
) -> Backend:
    """The backend called ``name``, ready to enter, for ``app``'s ClientApp."""
    if name == "inline":
        from fedcore.simulation.backends.inline import InlineBackend

        return InlineBackend(app.app.client, clock=clock)
    if name != "process":
        raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if app.client_ref is None:
        raise UsageError(
            "the process backend imports the ClientApp by name in each worker, and this one "
            "has no importable name (it was made inside a function, or in a notebook): "
            "define it at module level in a file, or use backend='inline'"
        )
    from fedcore.simulation.backends.process_pool import ProcessPoolBackend
    from fedcore.simulation.backends.sizing import plan_pool

    plan = plan_pool(resources, system, max_workers)
    return ProcessPoolBackend(app.client_ref, app.path or Path.cwd(), plan, clock)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "create_backend"]
