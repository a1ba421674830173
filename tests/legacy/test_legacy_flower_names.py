"""Flower 1.42's ``flwr.common`` and ``flwr.client``: every name of the legacy client side
is served, and is the kind of thing Flower's is (read from Flower's wheel, never imported)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from fedcore.apps.flower_imports import install_flower_imports
from fedcore.testing.flower_names import FlowerWheel, flower_wheel, forget_flower_imports, kind_of

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


@pytest.fixture(autouse=True)
def shim() -> Iterator[None]:
    """The shim installed for each test, and gone after it."""
    forget_flower_imports()
    install_flower_imports()
    yield
    forget_flower_imports()


@pytest.mark.parametrize("module", sorted(NOT_SERVED))
def test_every_legacy_name_of_flowers_module_is_served_as_the_samekind_of(
    wheel: FlowerWheel, module: str
) -> None:
    shim = importlib.import_module(module)
    names = [name for name in wheel.public_names(module) if name not in NOT_SERVED[module]]
    assert set(NOT_SERVED[module]) <= set(wheel.public_names(module))

    ours = {name: kind_of(getattr(shim, name)) for name in names}
    kinds = {name: wheel.kind(module, name) for name in names}

    # (a name whose kind the wheel reader cannot tell, such as `log`, is checked as served)
    assert {name: ours[name] for name, kind in kinds.items() if kind is not None} == {
        name: kind for name, kind in kinds.items() if kind is not None
    }
