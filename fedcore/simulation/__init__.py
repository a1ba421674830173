"""The simulation runtime: one process, many virtual nodes, a pluggable backend.

Each name is imported from its module on first use: a Ray actor imports this
package (:mod:`fedcore.simulation.backends.ray_tasks`), and loading its ClientApp
needs none of the engine, the link state or the progress display.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.simulation.engine import SimulationEngine, SimulationResult
    from fedcore.simulation.resources import Resources

__all__ = ["Resources", "SimulationEngine", "SimulationResult"]

# ``simulate`` and ``run_simulation`` are imported from their module (``fedcore`` offers
# them): as names of this package they would be shadowed by that module's own name.
_MODULES = {
    "engine": ("SimulationEngine", "SimulationResult"),
    "resources": ("Resources",),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
