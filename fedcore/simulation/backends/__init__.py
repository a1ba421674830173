"""Simulation backends; ``create_backend`` picks one by name.

A backend's module is imported when it is chosen, and the package imports none: a
Ray actor imports this package, and Ray is imported only by the ``ray`` backend, an
optional extra. The process backend is :mod:`fedcore.workers.pool`, which a deployed
node runs on too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import fedcore.defaults as defaults
from fedcore.errors import UsageError

if TYPE_CHECKING:
    from fedcore.apps.loading import LoadedApp
    from fedcore.clock import Clock
    from fedcore.simulation.resources import Resources
    from fedcore.workers.base import Backend

BACKENDS = defaults.BACKENDS
DEFAULT_BACKEND = defaults.DEFAULT_BACKEND
RAY_EXTRA = "pip install 'fedcore[ray]'"
"""What installs the ``ray`` backend's Ray."""


def create_backend(
    name: str,
    app: LoadedApp,
    resources: Resources,
    clock: Clock,
    *,
    system: Resources | None = None,
    max_workers: int | None = None,
    ray_address: str | None = None,
    max_value_len: int,
) -> Backend:
    """The backend called ``name``, ready to enter, for ``app``'s ClientApp.

    ``max_value_len`` is the cap on one str or bytes value of a record that its workers
    and the engine decode (:class:`~fedcore.wire.DecodeLimits`); the inline backend
    decodes nothing. It has no default here: this package is imported where a Ray
    actor starts, before its thread caps are set, and the wire's constants come with
    numpy."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if ray_address is not None and name != "ray":
        raise UsageError(f"ray_address is for backend='ray', not {name!r}")
    if name == "inline":
        from fedcore.simulation.backends.inline import InlineBackend

        return InlineBackend(app.app.client, clock=clock)
    if app.client_ref is None:
        raise UsageError(
            f"the {name} backend imports the ClientApp by name in each worker, and this one "
            "has no importable name (it was made inside a function, or in a notebook): "
            "define it at module level in a file, or use backend='inline'"
        )
    if name == "ray":
        return _ray_backend(
            app, app.client_ref, resources, clock, system, max_workers, ray_address, max_value_len
        )
    from fedcore.workers.pool import ProcessPoolBackend
    from fedcore.workers.sizing import plan_pool

    plan = plan_pool(resources, system, max_workers)
    return ProcessPoolBackend(
        app.client_ref, app.path or Path.cwd(), plan, clock, max_value_len=max_value_len
    )


def _ray_backend(
    app: LoadedApp,
    client_ref: str,
    resources: Resources,
    clock: Clock,
    system: Resources | None,
    max_workers: int | None,
    address: str | None,
    max_value_len: int,
) -> Backend:
    try:
        from fedcore.simulation.backends.ray import RayBackend
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise UsageError(
            f"the ray backend needs Ray, which is not installed: {RAY_EXTRA}"
        ) from None
    return RayBackend(
        client_ref,
        app.path,
        resources,
        clock,
        address=address,
        system=system,
        max_workers=max_workers,
        max_value_len=max_value_len,
    )


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "RAY_EXTRA", "create_backend"]
