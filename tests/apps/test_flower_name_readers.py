"""The readers of Flower's files the import-hook tests rely on, on small hand-made inputs."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from fedcore.testing.flower_names import FlowerWheel, flower_references, uses_legacy_api

PACKAGE = {
    "flwr/__init__.py": "",
    "flwr/app/__init__.py": (
        "from typing import TYPE_CHECKING\n"
        "from .constants import TTL\n"
        "from .types import Scalar, Values\n"
        "from ..records import Record as Record\n"
        "from . import sub\n"
        "if TYPE_CHECKING:\n"
        "    from flwr.records import make\n"
        "from typing import Any\n"
        "Alias = Record\n"
        "__all__ = ['TTL', 'Scalar', 'Values', 'Record', 'sub', 'make', 'Any', 'Alias']\n"
    ),
    "flwr/app/constants.py": "TTL = 43200\n",
    "flwr/app/types.py": "Scalar = int | float\nValues = list[Scalar]\n",
    "flwr/app/sub/__init__.py": "",
    "flwr/records.py": "class Record:\n    pass\n\ndef make():\n    return Record()\n",
}


@pytest.fixture
def wheel(tmp_path: Path) -> FlowerWheel:
    path = tmp_path / "flwr-0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in PACKAGE.items():
            archive.writestr(name, text)
    return FlowerWheel(path)


def test_the_public_names_are_the_modules_all(wheel: FlowerWheel) -> None:
    assert wheel.public_names("flwr.app") == [
        "TTL", "Scalar", "Values", "Record", "sub", "make", "Any", "Alias"
    ]  # fmt: skip
    with pytest.raises(LookupError, match=r"flwr\.records in the wheel has no __all__"):
        wheel.public_names("flwr.records")


def test_each_kind_is_read_through_the_re_exports(wheel: FlowerWheel) -> None:
    kinds = {name: wheel.kind("flwr.app", name) for name in wheel.public_names("flwr.app")}

    assert kinds == {
        "TTL": "constant",
        "Scalar": "type alias",
        "Values": "type alias",
        "Record": "class",
        "sub": "module",
        "make": "function",  # imported under TYPE_CHECKING only
        "Any": None,  # outside Flower
        "Alias": "class",
    }


def test_the_references_of_a_source_are_its_flwr_names() -> None:
    source = (
        "import flwr as fl\n"
        "import flwr.common.logger\n"
        "from flwr.app import ArrayRecord, Context\n"
        "from flwr.common.config import unflatten_dict\n"
        "from numpy import array\n"
        "strategy = fl.server.strategy.FedAvg(fraction_fit=1.0)\n"
        "app = ClientApp(client_fn=make)\n"
    )

    assert flower_references(source) == {
        "flwr",
        "flwr.common.logger",
        "flwr.app.ArrayRecord",
        "flwr.app.Context",
        "flwr.common.config.unflatten_dict",
        "flwr.server.strategy.FedAvg",
        "client_fn",
    }


@pytest.mark.parametrize(
    ("references", "legacy"),
    [
        ({"flwr.app.Message", "flwr.serverapp.strategy.FedAvg"}, False),
        ({"flwr.server.ServerApp", "flwr.server.Grid", "flwr.common.now"}, False),
        ({"flwr.app.Message", "flwr.server.strategy.FedAvg"}, True),
        ({"flwr.client.NumPyClient"}, True),
        ({"flwr.common.typing.Parameters"}, True),
        ({"flwr.clientapp.ClientApp", "client_fn"}, True),
        ({"flwr.simulation.run_simulation"}, True),
    ],
)
def test_an_app_is_legacy_by_what_only_the_legacy_api_has(
    references: set[str], legacy: bool
) -> None:
    assert uses_legacy_api(references) is legacy
