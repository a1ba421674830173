"""A package's public names, imported from their homes on first use.

``import fedcore`` and every ``fedcore`` command would otherwise pay, at start-up, for
every name a package re-exports: numpy for the records, the simulation engine, fifteen
strategies an app does not use. A package instead lists where each name lives, and its
module ``__getattr__`` imports that home the first time the name is looked up and keeps
the value, so that the next lookup is an ordinary attribute. Type checkers read the
package's ``TYPE_CHECKING`` imports instead, and see no catch-all: a misspelt name is
still their error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_attributes(
    namespace: MutableMapping[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose ``globals()`` is ``namespace``.

    ``homes`` maps each name to the submodule it lives in, relative to the package
    (``"records"`` for ``fedcore.domain.records``).
    """
    package = namespace["__name__"]
    shadowed = set(homes) & {home.split(".")[0] for home in homes.values()}
    if shadowed:  # importing that submodule would bind its name to the module instead
        raise ValueError(f"{package} names {sorted(shadowed)} after submodules of its own")

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value  # the next lookup is an ordinary one
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
