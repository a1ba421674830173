"""Flower's own unit tests of its public API, run on fedcore (tests/flower_unit/README.md).

One test here per test of Flower's: it passes when Flower's test passes on fedcore,
or, for a test in :data:`EXPECTED`, when it fails exactly as its entry says. The
ported tests run once, in a pytest process of their own, when this module is
collected; without a clone of Flower's repository everything here is skipped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedcore.errors import FlowerInternalError, MessageInitializationError
from fedcore.testing.flower_repo import FlowerRepoUnavailable
from fedcore.testing.flower_unit import FlowerTestOutcome, FlowerUnitRun, run_flower_unit_tests

FROM_FLOWER = Path(__file__).parents[2] / "docs" / "from-flower.md"
INTERNAL_ERROR = f"{FlowerInternalError.__module__}.{FlowerInternalError.__qualname__}"
INITIALIZATION_ERROR = (
    f"{MessageInitializationError.__module__}.{MessageInitializationError.__qualname__}"
)

INTERNAL, DIFFERENCE = "needs a Flower internal", "deliberate difference"


@dataclass(frozen=True)
class Expected:
    """How a test of Flower's fails on fedcore, and why.

    ``INTERNAL``: it fails on the stand-in of ``subject``, a Flower internal.
    ``DIFFERENCE``: it fails, and ``subject`` is a line of docs/from-flower.md saying why.
    """

    kind: str
    why: str
    subject: str = ""


def internal(name: str, why: str) -> Expected:
    """``name``: the internal's Flower name, or ``.attr``, an attribute of a public class
    that fedcore's lacks (the test fails on an AttributeError naming it)."""
    return Expected(INTERNAL, why, name)


def difference(documented: str, why: str) -> Expected:
    return Expected(DIFFERENCE, why, documented)


_INFLATABLE = (
    "inflatable objects: Flower's content-addressed transfer format; fedcore's wire is its own"
)
_CONSTANTS = "Flower's constants module (flwr.common.constant)"
_STYPE = "flwr.common.constant.SType"
_HOLDS_NDARRAYS = "An `ArrayRecord` holds ndarrays, not `Array` objects"
_MOCKS_ARRAY = "it mocks Array.from_numpy_ndarray and expects the record to hold what it returns"
_TORCH_MISSING = "Flower raises `RuntimeError` when torch was not imported"
_KEY_CLIPPING_NORM = "flwr.common.differential_privacy_constants.KEY_CLIPPING_NORM"
_DP_CONSTANTS = "Flower's differential-privacy constants module (its config keys)"

# Flower's test files, as the ids below start
ARRAY = "common/record/array_test.py::TestArray::"
ARRAYCHUNK = "common/record/arraychunk_test.py::"
ARRAYRECORD = "common/record/arrayrecord_test.py::"
CONVERSION = "common/record/conversion_utils_test.py::"
RECORDDICT = "common/record/recorddict_test.py::"
MESSAGE = "common/message_test.py::"
CLIENTAPP = "clientapp/client_app_test.py::"
DP_MODS = "clientapp/mod/dp_mods_test.py::"
SERVERAPP = "server/server_app_test.py::"
MESSAGE_HANDLER = "client/message_handler/message_handler_test.py::"
BULYAN = "serverapp/strategy/bulyan_test.py::"
FEDOPT = "serverapp/strategy/fedopt_test.py::"
MULTIKRUM = "serverapp/strategy/multikrum_test.py::"
STRATEGY_UTILS = "serverapp/strategy/strategy_utils_test.py::"
GRID_CLIENT_PROXY = "server/compat/grid_client_proxy_test.py::GridClientProxyTestCase::"

EXPECTED: dict[str, Expected] = {
    # ---- records
    ARRAY + "test_array_from_numpy": difference(
        "`.data` is numpy's buffer of the raw bytes", "it reads .data as numpy.save output"
    ),
    ARRAY + "test_deflate_and_inflate_0": internal(".slice_array", _INFLATABLE),
    ARRAY + "test_deflate_and_inflate_1": internal(".slice_array", _INFLATABLE),
    ARRAY + "test_deflate_and_inflate_empty_array": internal(".inflate", _INFLATABLE),
    ARRAY + "test_from_torch_tensor_with_torch": internal(_STYPE, _CONSTANTS),
    ARRAY + "test_numpy_conversion_valid": internal(_STYPE, _CONSTANTS),
    ARRAY + "test_slicing_and_concatenation": internal(
        "flwr.common.constant.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", _INFLATABLE
    ),
    ARRAYCHUNK + "*": internal("flwr.common.record.arraychunk.ArrayChunk", _INFLATABLE),
    ARRAYRECORD + "TestArrayRecord::test_from_numpy_ndarrays_0": difference(
        _HOLDS_NDARRAYS, _MOCKS_ARRAY
    ),
    ARRAYRECORD + "TestArrayRecord::test_from_numpy_ndarrays_1": difference(
        _HOLDS_NDARRAYS, _MOCKS_ARRAY
    ),
    ARRAYRECORD + "TestArrayRecord::test_from_torch_state_dict_with_torch": difference(
        _HOLDS_NDARRAYS, _MOCKS_ARRAY
    ),
    ARRAYRECORD + "TestArrayRecord::test_from_torch_state_dict_without_torch": difference(
        _TORCH_MISSING, "it clears sys.modules and expects RuntimeError"
    ),
    ARRAYRECORD + "TestArrayRecord::test_to_state_dict_without_torch": difference(
        _TORCH_MISSING, "it clears sys.modules and expects RuntimeError"
    ),
    ARRAYRECORD + "TestArrayRecord::test_inflation_deflation_*": internal(".children", _INFLATABLE),
    ARRAYRECORD + "TestArrayRecord::test_inflation_with_unsupported_children": internal(
        ".deflate", _INFLATABLE
    ),
    ARRAYRECORD + "TestArrayRecord::test_init_array_dict_keep_input_*": internal(
        _STYPE, _CONSTANTS
    ),
    ARRAYRECORD + "test_count_bytes[*": difference(
        "Flower's also counts the `numpy.save` header",
        "it counts numpy.save output (flwr.common.ndarray_to_bytes)",
    ),
    RECORDDICT + "test_copy_record[original2]": difference(
        "`a == b` compares element-wise", "it compares two lists of (key, Array) items"
    ),
    RECORDDICT + "test_metric_and_config_record_deflate_and_inflate[*": internal(
        ".children", _INFLATABLE
    ),
    RECORDDICT + "test_recorddict_deflate_and_inflate[*": internal(".children", _INFLATABLE),
    RECORDDICT + "test_recorddict_raises_value_error_with_unsupported_children": internal(
        ".deflate", _INFLATABLE
    ),
    RECORDDICT + "test_set_parameters_with_incorrect_types[str-<lambda>0]": difference(
        _HOLDS_NDARRAYS, "it expects a plain ndarray value to be refused"
    ),
    # ---- Message
    # ---- ClientApp, ServerApp
    **{
        app + f"test_lifespan_{case}": internal(
            "._lifespan", "it enters the app's private _lifespan context manager"
        )
        for app in (CLIENTAPP, SERVERAPP)
        for case in ("success", "failure", "multiple_yields")
    },
    **{
        app + "test_lifespan_no_yield": difference(
            "A lifespan that is no generator function is refused when registered",
            "it registers a lifespan that is no generator function, and reads _lifespan",
        )
        for app in (CLIENTAPP, SERVERAPP)
    },
    # ---- mods
    DP_MODS + "test_adaptiveclipping_mod_handles_scalar_ndarray": internal(
        _KEY_CLIPPING_NORM, _DP_CONSTANTS
    ),
    DP_MODS + "test_fixedclipping_mod_handles_scalar_ndarray": internal(
        _KEY_CLIPPING_NORM, _DP_CONSTANTS
    ),
    DP_MODS + "test_localdp_mod_handles_scalar_ndarray": difference(
        "They clip a 0-d array's update too",
        "it asserts Flower's unclipped 0-d update (2.0 for a clipping norm of 1.0)",
    ),
    # ---- strategies
    BULYAN + "*": internal(
        "flwr.serverapp.strategy.bulyan.aggregate_n_closest_weights", "a private helper of Bulyan"
    ),
    FEDOPT + "test_compute_deltat_raises_error_*": internal(
        "flwr.serverapp.strategy.fedopt.FedOpt",
        "FedOpt, the base of FedAdam and others, is not public",
    ),
    MULTIKRUM + "test_aggregate_train_*": internal(".object_id", _INFLATABLE),
    STRATEGY_UTILS + "test_arrayrecords_aggregation*": internal(".object_id", _INFLATABLE),
    STRATEGY_UTILS + "test_metricrecords_aggregation": internal(
        ".__dict__", "it reads a record's private storage, record.__dict__['_data']"
    ),
    MESSAGE + "test_inflate_deflate_message_with_*": internal(".children", _INFLATABLE),
    MESSAGE + "test_object_id_excludes_message_id_in_metadata": internal(".object_id", _INFLATABLE),
    MESSAGE + "test_remove_content_from_message": internal(
        "flwr.common.message.remove_content_from_message", "a helper of Flower's fleet servers"
    ),
    MESSAGE + "test_repr[Message-*": internal(
        "Message(metadata=...)", "Flower's constructor form for rebuilding a message, internal"
    ),
    MESSAGE + "test_reply_ttl_limitation[*": internal(
        "flwr.common.constant.MESSAGE_TTL_TOLERANCE", _CONSTANTS
    ),
    CONVERSION + "*": internal(
        "flwr.common.record.conversion_utils.array_from_numpy", "a private helper of Array"
    ),
    # ---- the legacy API (NumPyClient, Parameters, Server, GridClientProxy)
    GRID_CLIENT_PROXY + "*": difference(
        "changes that stand-in only, not the fedcore code behind it",
        "it patches the Message class inside Flower's grid_client_proxy module and checks "
        "the messages the proxy built with the patch (tests/legacy/test_legacy_server.py "
        "checks what they would: the content, the reply, the error)",
    ),
    MESSAGE_HANDLER + "test_client_with*": internal(
        "flwr.client.message_handler.message_handler.handle_legacy_message_from_msgtype",
        "Flower's legacy message handler; fedcore's ClientApp(client_fn=...) answers itself",
    ),
    MESSAGE_HANDLER + "TestMessageValidation::test_valid_message": internal(
        ".object_id", _INFLATABLE
    ),
    MESSAGE_HANDLER + "TestMessageValidation::test_invalid_message_run_id": difference(
        "`Metadata` is a dataclass with slots",
        "it copies Metadata and sets Flower's private fields, read with vars()",
    ),
}
"""Flower's tests that do not pass on fedcore, by id (``common/message_test.py::test_x``),
or by the start of their ids when the key ends with ``*``; every other test of Flower's
must pass."""


@functools.cache
def flower_run() -> FlowerUnitRun | str:
    """Flower's tests, ported and run once; or why they cannot be."""
    try:
        return run_flower_unit_tests()
    except FlowerRepoUnavailable as exc:
        return f"{exc} (tests/flower_unit/README.md)"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name, ids in (
        ("flower_test", lambda run: sorted(run.outcomes)),
        ("flower_file", lambda run: run.files),
    ):
        if name in metafunc.fixturenames:
            run = flower_run()
            if isinstance(run, str):
                metafunc.parametrize(name, [pytest.param("", marks=pytest.mark.skip(reason=run))])
            else:
                metafunc.parametrize(name, ids(run), ids=ids(run))


@pytest.fixture
def run() -> FlowerUnitRun:
    found = flower_run()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def expectation(test: str) -> Expected | None:
    """The entry of :data:`EXPECTED` for ``test``, if any (at most one may match)."""
    matches = [key for key in EXPECTED if _matches(test, key)]
    assert len(matches) <= 1, f"{test} matches several entries: {matches}"
    return EXPECTED[matches[0]] if matches else None


def _matches(test: str, key: str) -> bool:
    return test.startswith(key[:-1]) if key.endswith("*") else test == key


def _shown(outcome: FlowerTestOutcome) -> str:
    return f"{outcome.outcome}: {outcome.exception}: {outcome.message}"


def test_flower_test(flower_test: str, run: FlowerUnitRun) -> None:
    outcome = run.outcomes[flower_test]
    expected = expectation(flower_test)
    if expected is None:
        assert outcome.outcome == "passed", _shown(outcome)
        return
    assert outcome.outcome in ("failed", "error"), (
        f"listed as {expected.kind!r} ({expected.why}) but {outcome.outcome}: take it off the list"
    )
    if expected.kind == INTERNAL and expected.subject.startswith("."):
        assert outcome.exception == "builtins.AttributeError", _shown(outcome)
        assert outcome.message.endswith(f"attribute {expected.subject[1:]!r}"), _shown(outcome)
    elif expected.kind == INTERNAL and expected.subject.endswith("=...)"):
        keyword = expected.subject.partition("(")[2].removesuffix("=...)")
        assert outcome.exception == INITIALIZATION_ERROR, _shown(outcome)
        assert f"takes no argument {keyword!r}" in outcome.message, _shown(outcome)
    elif expected.kind == INTERNAL:
        assert outcome.exception == INTERNAL_ERROR, _shown(outcome)
        assert outcome.message == str(FlowerInternalError(expected.subject)), _shown(outcome)
    elif expected.kind == DIFFERENCE:
        documented = " ".join(FROM_FLOWER.read_text(encoding="utf-8").split())
        assert expected.subject in documented, f"docs/from-flower.md lacks {expected.subject!r}"
    else:
        raise AssertionError(f"no check for {expected.kind!r}")


def test_flower_file_is_collected(flower_file: str, run: FlowerUnitRun) -> None:
    assert flower_file not in run.uncollected, run.uncollected[flower_file]


def test_every_entry_names_flower_tests(run: FlowerUnitRun) -> None:
    stale = [key for key in EXPECTED if not any(_matches(t, key) for t in run.outcomes)]
    assert not stale, f"entries that match no test of Flower's: {stale}"
