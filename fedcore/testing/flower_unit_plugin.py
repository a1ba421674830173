"""The pytest plugin of the process that runs Flower's ported unit tests.

Loaded with ``-p fedcore.testing.flower_unit_plugin`` by
:func:`fedcore.testing.flower_unit.run_flower_unit_tests`, and nowhere else: it answers
the process's ``import flwr…`` with fedcore's objects before any test module is
imported, has the stand-ins of Flower internals give stand-ins back while the test
modules are imported and raise once the tests run, and writes each test's outcome
(and each file that could not be collected) as JSON to the file
``$FEDCORE_FLOWER_UNIT_REPORT`` names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator

import pytest

from fedcore.apps.flower_imports import install_flower_imports
from fedcore.testing.flower_unit import REPORT_ENV, defer_internals

_outcomes: dict[str, dict[str, str]] = {}
_uncollected: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    install_flower_imports()
    defer_internals(True)


def pytest_collection_finish(session: pytest.Session) -> None:
    defer_internals(False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield  # after unittest's own hook has put a TestCase's exception on `call`
    entry = _outcomes.setdefault(item.nodeid, {"outcome": "passed"})
    if entry["outcome"] != "passed":
        return report
    if report.failed:
        entry["outcome"] = "failed" if call.when == "call" else "error"
        if call.excinfo is not None:
            exc_type = call.excinfo.type
            entry["exception"] = f"{exc_type.__module__}.{exc_type.__qualname__}"
            entry["message"] = str(call.excinfo.value)[:1000]
    elif report.skipped:
        entry["outcome"] = "skipped"
    return report


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _uncollected[report.nodeid] = str(report.longrepr)[-2000:]


def pytest_sessionfinish(session: pytest.Session) -> None:
    with open(os.environ[REPORT_ENV], "w", encoding="utf-8") as out:
        json.dump({"outcomes": _outcomes, "uncollected": _uncollected}, out, indent=1)
