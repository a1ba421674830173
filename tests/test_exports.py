"""The public surface: fedcore.__all__ is complete, sorted and importable."""

from __future__ import annotations

import inspect

import fedcore
import fedcore.data
import fedcore.mods
import fedcore.strategy


def test_all_is_sorted() -> None:
    assert fedcore.__all__ == sorted(fedcore.__all__)


def test_all_names_exist() -> None:
    for name in fedcore.__all__:
        assert hasattr(fedcore, name), name


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(fedcore).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(fedcore.__all__)


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
