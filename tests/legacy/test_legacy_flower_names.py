"""Flower 1.42's ``flwr.common`` and ``flwr.client``: every name of the legacy client side
is served, and is the kind of thing Flower's is (read from Flower's wheel, never imported)."""

from __future__ import annotations

import importlib
import sys
import types
import typing
from collections.abc import Iterator
from types import ModuleType

import pytest

from fedcore.apps.flower_imports import install_flower_imports
from fedcore.testing.flower_names import FlowerWheel, Kind, flower_wheel

NOT_SERVED = {
    "flwr.common": {
        # the legacy deployment's protobuf messages and gRPC limit: Flower's own wire
        "ClientMessage": "protobuf",
        "ServerMessage": "protobuf",
        "GRPC_MAX_MESSAGE_LENGTH": "gRPC",
        # Flower's telemetry and logging set-up
        "EventType": "telemetry",
        "event": "telemetry",
        "configure": "Flower's remote logging",
        # the Message API's deprecated aliases and helpers (not the legacy client side)
        "ConfigsRecord": "Message API",
        "MetricsRecord": "Message API",
        "ParametersRecord": "Message API",
        "RecordSet": "Message API",
        "array_from_numpy": "Message API",
    },
    "flwr.client": {
        # Flower's legacy deployment entry points talk Flower's wire protocol
        "start_client": "deployment",
        "start_numpy_client": "deployment",
        # the legacy mods of legacy-shaped messages (the legacy DP strategies' half)
        "mod": "legacy mods",
    },
}
"""Names of the two modules' ``__all__`` that the legacy client side leaves out, and why."""


@pytest.fixture(scope="module")
def wheel() -> FlowerWheel:
    try:
        return flower_wheel()
    except LookupError as exc:
        pytest.skip(str(exc))


def _forget() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_FlowerFinder"]
    for name in [n for n in sys.modules if n == "flwr" or n.startswith("flwr.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def shim() -> Iterator[None]:
    """The shim installed for each test, and gone after it."""
    _forget()
    install_flower_imports()
    yield
    _forget()


@pytest.mark.parametrize("module", sorted(NOT_SERVED))
def test_every_legacy_name_of_flowers_module_is_served_as_the_same_kind(
    wheel: FlowerWheel, module: str
) -> None:
    shim = importlib.import_module(module)
    names = [name for name in wheel.public_names(module) if name not in NOT_SERVED[module]]
    assert set(NOT_SERVED[module]) <= set(wheel.public_names(module))

    ours = {name: _kind(getattr(shim, name)) for name in names}
    kinds = {name: wheel.kind(module, name) for name in names}

    # (a name whose kind the wheel reader cannot tell, such as `log`, is checked as served)
    assert {name: ours[name] for name, kind in kinds.items() if kind is not None} == {
        name: kind for name, kind in kinds.items() if kind is not None
    }


def _kind(value: object) -> Kind:
    if isinstance(value, ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if isinstance(value, types.UnionType | types.GenericAlias) or typing.get_origin(value):
        return "type alias"
    if callable(value):
        return "function"
    return "constant"
