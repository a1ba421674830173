"""The rule that ports Flower's unit tests (fedcore/testing/flower_unit.py), on made-up
modules: no clone of Flower's repository needed."""

from __future__ import annotations

import types

import pytest

from fedcore.errors import FlowerInternalError
from fedcore.testing.flower_unit import (
    PortError,
    defer_internals,
    flower_internal,
    flower_module_name,
    port_module,
    served_module,
)

SERVED = {
    "flwr.app": {"ArrayRecord", "Context"},
    "flwr.common": {"ArrayRecord", "Context", "ndarray_to_bytes"},
    "flwr.serverapp.strategy": {"FedAvg"},
    "flwr.serverapp.strategy.strategy_utils": {"aggregate_arrayrecords"},
}
PORTED = {"flwr.serverapp.strategy.fedavg_test", "flwr.serverapp.strategy.utils_test"}


def test_a_name_comes_from_the_closest_module_that_serves_it() -> None:
    assert served_module("ArrayRecord", "flwr.common.record.arrayrecord", SERVED) == "flwr.common"
    assert served_module("Context", "flwr.app.context", SERVED) == "flwr.app"
    assert served_module("Context", "flwr.supercore.context", SERVED) == "flwr.app"
    assert served_module("FedAvg", "flwr.serverapp.strategy.fedavg", SERVED) == (
        "flwr.serverapp.strategy"
    )
    assert served_module("_private", "flwr.serverapp.strategy.fedavg", SERVED) is None


def test_a_message_api_strategy_name_never_comes_from_the_legacy_strategies() -> None:
    served = {**SERVED, "flwr.server.strategy": {"FedAvg", "FedOpt"}}

    assert served_module("FedOpt", "flwr.serverapp.strategy.fedopt", served) is None
    assert served_module("FedOpt", "flwr.server.strategy.fedopt", served) == (
        "flwr.server.strategy"
    )
    assert served_module("FedAvg", "flwr.server.strategy.fedavg", served) == (
        "flwr.server.strategy"
    )


def test_only_import_lines_change_and_keep_their_line_numbers() -> None:
    source = (
        "import numpy as np\n"
        "from flwr.common import ArrayRecord, ndarray_to_bytes as to_bytes\n"
        "from .fedavg import (\n"
        "    FedAvg,\n"
        "    _helper,\n"
        ")\n"
        "from .strategy_utils import aggregate_arrayrecords\n"
        "from .utils_test import make_reply\n"
        "from ...common.constant import SType\n"
        "\n"
        "def test_x():\n"
        "    from flwr.app import Context\n"
        "    return np, ArrayRecord\n"
    )
    ported = port_module(source, "flwr.serverapp.strategy.fedavg_test", PORTED, SERVED)
    lines = ported.splitlines()
    assert len(lines) == len(source.splitlines())
    assert lines[0] == "import numpy as np"
    assert lines[1] == (
        "from flwr.common import ArrayRecord; from flwr.common import ndarray_to_bytes as to_bytes"
    )
    assert lines[2] == (
        "from flwr.serverapp.strategy import FedAvg; "
        "from fedcore.testing.flower_unit import flower_internal as _flower_internal; "
        "_helper = _flower_internal('flwr.serverapp.strategy.fedavg._helper')"
    )
    assert lines[3:6] == ["", "", ""]
    assert lines[6] == ("from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords")
    assert lines[7] == "from flwr_tests.serverapp.strategy.utils_test import make_reply"
    assert lines[8].endswith("SType = _flower_internal('flwr.common.constant.SType')")
    assert lines[10:] == source.splitlines()[10:]
    compile(ported, "ported", "exec")


def test_imports_the_rule_cannot_port_are_refused() -> None:
    with pytest.raises(PortError, match=r"import \*"):
        port_module("from flwr.common import *\n", "flwr.common.x_test", PORTED, SERVED)
    with pytest.raises(PortError, match=r"flwr\.common\.serde"):
        port_module("import flwr.common.serde\n", "flwr.common.x_test", PORTED, SERVED)
    with pytest.raises(PortError):
        flower_module_name("examples/app/task.py")
    assert flower_module_name("framework/py/flwr/common/message_test.py") == (
        "flwr.common.message_test"
    )


def test_a_flower_internal_raises_only_when_used() -> None:
    stand_in = flower_internal("flwr.common.constant.SType")
    assert "flwr.common.constant.SType" in repr(stand_in)
    assert not hasattr(stand_in, "__wrapped__")  # probes by inspect and pytest stay quiet
    uses = [
        lambda: stand_in.NUMPY,
        lambda: stand_in(1),
        lambda: stand_in["x"],
        lambda: list(stand_in),
        lambda: stand_in == "numpy.ndarray",
        lambda: {stand_in: 1.0},
        lambda: stand_in + 1,
        lambda: isinstance(1, stand_in),  # type: ignore[arg-type]
        lambda: types.new_class("Sub", (stand_in,)),
    ]
    for use in uses:
        with pytest.raises(FlowerInternalError) as raised:
            use()
        assert raised.value.name == "flwr.common.constant.SType"


def test_while_modules_are_imported_a_use_gives_a_stand_in_back() -> None:
    stand_in = flower_internal("flwr.common.serde_test.RecordMaker")
    defer_internals(True)
    try:
        parameters = {"metadata": stand_in(1).metadata(), "value": stand_in.A | stand_in.B}
        assert isinstance(parameters["metadata"], object)
    finally:
        defer_internals(False)
    for use in (lambda: isinstance(parameters["metadata"], int), lambda: parameters["value"]()):
        with pytest.raises(FlowerInternalError, match="RecordMaker"):
            use()
