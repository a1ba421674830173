"""Simulation backends; ``create_backend`` picks one by name."""

from fedcore.apps.loading import LoadedApp
from fedcore.errors import UsageError
from fedcore.simulation.backends.base import Backend
from fedcore.simulation.backends.inline import InlineBackend
from fedcore.simulation.resources import Resources

BACKENDS = ("inline",)


def create_backend(name: str, app: LoadedApp, resources: Resources) -> Backend:
    """The backend called ``name``, ready to enter, for ``app``'s ClientApp."""
    if name == "inline":
        return InlineBackend(app.app.client)
    raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "InlineBackend", "create_backend"]
