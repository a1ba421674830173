"""The public surface: fedcore.__all__ is complete, sorted and importable."""

from __future__ import annotations

import inspect
import subprocess
import sys
from types import ModuleType

import pytest

import fedcore
import fedcore.apps
import fedcore.data
import fedcore.domain
import fedcore.mods
import fedcore.simulation
import fedcore.strategy
import fedcore.transport.http
from fedcore.lazy import lazy_attributes


def test_all_is_sorted() -> None:
    assert fedcore.__all__ == sorted(fedcore.__all__)


def test_all_names_exist() -> None:
    for name in fedcore.__all__:
        assert hasattr(fedcore, name), name


def test_all_is_complete() -> None:
    # dir(), not vars(): the package imports its names on first use (module __getattr__),
    # and dir() lists those not yet used as well as every name already in its namespace.
    public = {
        name
        for name in dir(fedcore)
        if not name.startswith("_") and not inspect.ismodule(getattr(fedcore, name))
    }
    assert public == set(fedcore.__all__)


@pytest.mark.parametrize(
    "package",
    [
        fedcore,
        fedcore.apps,
        fedcore.domain,
        fedcore.simulation,
        fedcore.strategy,
        fedcore.transport.http,
    ],
)
def test_a_lazy_package_knows_a_home_for_exactly_its_public_names(package: ModuleType) -> None:
    # dir() lists __all__ whatever the homes hold: a name with a home but left out of
    # __all__ (or the reverse) is caught here, not there.
    homes = vars(package)["_HOMES"]
    assert set(homes) == set(package.__all__)


def test_a_lazy_package_may_not_name_a_name_after_one_of_its_submodules() -> None:
    # Importing the submodule binds its name in the package, so the name would be the
    # module or the function depending on what was imported first.
    with pytest.raises(ValueError, match=r"\['simulate'\] after submodules"):
        lazy_attributes({"__name__": "pkg", "__all__": ["simulate"]}, {"simulate": "simulate"})


def test_simulate_is_the_function_whatever_was_imported_first() -> None:
    code = (
        "import fedcore.simulation.simulate, fedcore as fc, inspect; "
        "assert inspect.iscoroutinefunction(fc.simulate), fc.simulate; "
        "assert callable(fc.run_simulation)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_every_name_imports_by_from_import() -> None:
    namespace: dict[str, object] = {}
    exec(f"from fedcore import {', '.join(fedcore.__all__)}", namespace)
    for name in fedcore.__all__:
        assert namespace[name] is getattr(fedcore, name), name


def test_design_api_names_are_exported() -> None:
    """The names DESIGN.md §1.2 uses through `fc.` are all there."""
    for name in (
        "App",
        "ArrayRecord",
        "ClientApp",
        "ConfigRecord",
        "Context",
        "Error",
        "Grid",
        "Message",
        "MetricRecord",
        "RecordDict",
        "Resources",
        "ServerApp",
        "run_simulation",
        "simulate",
    ):
        assert name in fedcore.__all__, name


def test_subpackage_surfaces_are_sorted() -> None:
    for module in (fedcore.strategy, fedcore.data, fedcore.mods):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name)
