"""Flower's own unit tests of its public API, ported by their import lines and run on fedcore.

The files :data:`FLOWER_UNIT_TESTS` names are taken from Flower's repository at test
time (:mod:`fedcore.testing.flower_repo`); nothing of them is kept here. Each is
ported by :func:`port_module`, which rewrites its import statements and nothing
else, by one rule, for each name a statement imports from a Flower module:

- a name fedcore serves (a name of a module of :data:`FLOWER_NAMES`) is imported
  from the public ``flwr`` module that serves it — of those that do, the one sharing
  the longest dotted prefix with the module the test named, then the shortest, then
  the first by name; never, for a name of the Message API's strategies, from the
  legacy ``flwr.server.strategy`` (its ``FedOpt`` is another class of the same name);
- a name of one of the ported test modules (``from .strategy_utils_test import …``)
  is imported from that module, ported too, under :data:`PORTED_PACKAGE`;
- any other name is a Flower internal (protobuf serde, inflatable objects, constants,
  private helpers): it is bound to a stand-in, :func:`flower_internal`, that raises
  :class:`~fedcore.errors.FlowerInternalError` naming it when a test touches it, so
  only the tests that use it fail, not their whole module.

The helper modules of :data:`FLOWER_UNIT_HELPERS` are ported with them (imported by
the tests, not run). A rewritten statement keeps its lines (padded with blank ones),
so a traceback's line numbers are Flower's. :func:`run_flower_unit_tests` runs the
ported package with pytest in a process of its own, where ``import flwr…`` is answered
by fedcore's hook (:mod:`fedcore.testing.flower_unit_plugin`), and returns every test's
outcome.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NoReturn

from fedcore.apps.flower_imports import FLOWER_NAMES
from fedcore.errors import FlowerInternalError
from fedcore.testing.flower_repo import extract_flower, flower_paths

FLOWER_SOURCE = "framework/py/flwr/"
"""Where package ``flwr`` lives in Flower's repository."""

FLOWER_UNIT_TESTS = (
    f"{FLOWER_SOURCE}common/record/*_test.py",
    f"{FLOWER_SOURCE}common/message_test.py",
    f"{FLOWER_SOURCE}clientapp/client_app_test.py",
    f"{FLOWER_SOURCE}clientapp/mod/*_test.py",
    f"{FLOWER_SOURCE}server/server_app_test.py",
    f"{FLOWER_SOURCE}serverapp/strategy/*_test.py",
    # the legacy API: strategies, client manager and proxies
    f"{FLOWER_SOURCE}server/strategy/*_test.py",
    f"{FLOWER_SOURCE}server/client_manager_test.py",
    f"{FLOWER_SOURCE}server/client_proxy_test.py",
    f"{FLOWER_SOURCE}server/criterion_test.py",
    # the legacy API: its client side
    f"{FLOWER_SOURCE}common/parameter_test.py",
    f"{FLOWER_SOURCE}common/recorddict_compat_test.py",
    f"{FLOWER_SOURCE}client/client_test.py",
    f"{FLOWER_SOURCE}client/numpy_client_test.py",
    f"{FLOWER_SOURCE}client/message_handler/message_handler_test.py",
    # the legacy API: its server side
    f"{FLOWER_SOURCE}server/server_test.py",
    f"{FLOWER_SOURCE}server/history_test.py",
    f"{FLOWER_SOURCE}server/compat/*_test.py",
)
"""Flower's unit tests of its public Message API — records, Message, ClientApp and its
mods, ServerApp, strategies — and of the legacy API: its strategies, ClientManager,
ClientProxy and Criterion; Parameters, the RecordDict compat functions, Client,
NumPyClient; Server, History, GridClientProxy and the Grid's client registration."""

FLOWER_UNIT_HELPERS = (f"{FLOWER_SOURCE}common/serde_test.py",)
"""Flower test modules the tests above import helpers from (``serde_test``'s
``RecordMaker``, which builds records and Metadata with public names only): ported the
same way, their own tests not run (they test Flower's protobuf serde)."""

PORTED_PACKAGE = "flwr_tests"
"""The package the ported test modules form, laid out as ``flwr`` is (``flwr.common.
message_test`` is ``flwr_tests.common.message_test``)."""

REPORT_ENV = "FEDCORE_FLOWER_UNIT_REPORT"
"""Where the plugin of the pytest process writes the outcomes, as JSON."""

_PYTEST_INI = """\
[pytest]
filterwarnings = ignore::DeprecationWarning
timeout = 60
"""
"""The pytest settings of the run: Flower's own warning filter, and a timeout."""


class _FlowerInternal:
    """A stand-in for a Flower internal: using it raises FlowerInternalError.

    While the ported modules are imported (pytest's collection), a use that can give
    an object back — an attribute, a call, an item, an operator — gives another
    stand-in of the same internal instead, so a module that builds its test
    parameters with an internal still imports; the tests that get those parameters
    fail when they use them (an ``isinstance`` check of one included).
    """

    __slots__ = ("_flower_name",)
    _flower_name: str
    deferring: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_flower_name", name)

    def _used(self, *args: object, **kwargs: object) -> NoReturn:
        raise FlowerInternalError(self._flower_name)

    def _deferred(self, *args: object, **kwargs: object) -> _FlowerInternal:
        if not _FlowerInternal.deferring:
            self._used()
        return _FlowerInternal(self._flower_name)

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):  # probes (inspect, pytest, mock) expect AttributeError
            raise AttributeError(attr)
        return self._deferred()

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # what isinstance() asks of an object of another type
        if not _FlowerInternal.deferring:
            self._used()
        return _FlowerInternal

    def __repr__(self) -> str:
        return f"<Flower internal {self._flower_name}>"

    def __mro_entries__(self, bases: tuple[object, ...]) -> NoReturn:
        self._used()

    def __hash__(self) -> int:  # a dict key or set member is a use, once tests run
        if not _FlowerInternal.deferring:
            self._used()
        return id(self)

    __call__ = __getitem__ = __or__ = __ror__ = __neg__ = _deferred
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _deferred
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _deferred
    __setattr__ = __delattr__ = __setitem__ = __iter__ = __len__ = __contains__ = _used
    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _used
    __instancecheck__ = __subclasscheck__ = _used
    __int__ = __float__ = __index__ = __enter__ = __exit__ = _used


def flower_internal(name: str) -> object:
    """The stand-in a ported test gets for the Flower internal ``name`` (``module.attr``)."""
    return _FlowerInternal(name)


def defer_internals(deferring: bool) -> None:
    """Whether a use of a stand-in gives another one (while modules are imported) or
    raises (while tests run); see :class:`_FlowerInternal`."""
    _FlowerInternal.deferring = deferring


class PortError(ValueError):
    """An import statement of a Flower test that the rule cannot port."""


def flower_module_name(path: str) -> str:
    """The Flower module of a file of Flower's repository (``framework/py/flwr/a/b.py``
    -> ``flwr.a.b``)."""
    if not path.startswith(FLOWER_SOURCE) or not path.endswith(".py"):
        raise PortError(f"{path} is not a module of Flower's package")
    return "flwr." + path.removeprefix(FLOWER_SOURCE).removesuffix(".py").replace("/", ".")


def served_module(
    name: str, imported_from: str, served: Mapping[str, Collection[str]] = FLOWER_NAMES
) -> str | None:
    """The public ``flwr`` module ``from imported_from import name`` gets ``name`` from,
    or None if fedcore serves it nowhere (the module docstring's rule)."""
    candidates = [
        module
        for module, names in served.items()
        if name in names and not _other_api(module, imported_from)
    ]
    if not candidates:
        return None
    wanted = imported_from.split(".")

    def closeness(module: str) -> tuple[int, int, str]:
        parts = module.split(".")
        shared = next(
            (i for i, (a, b) in enumerate(zip(parts, wanted, strict=False)) if a != b), None
        )
        common = min(len(parts), len(wanted)) if shared is None else shared
        return (-common, len(parts), module)

    return min(candidates, key=closeness)


LEGACY_STRATEGIES = "flwr.server.strategy"
MESSAGE_API_STRATEGIES = "flwr.serverapp.strategy"


def _other_api(module: str, imported_from: str) -> bool:
    """Whether ``module`` holds the legacy strategies and the test imports from the Message
    API's: both APIs have a ``FedOpt``, a ``FedAvg``…, and one is never the other."""
    legacy = f"{LEGACY_STRATEGIES}."
    return (module + ".").startswith(legacy) and (imported_from + ".").startswith(
        f"{MESSAGE_API_STRATEGIES}."
    )


def port_module(
    source: str,
    module: str,
    ported: Collection[str],
    served: Mapping[str, Collection[str]] = FLOWER_NAMES,
) -> str:
    """The Flower test module ``module`` (its ``source``), its import statements ported.

    ``ported`` are the Flower names of every test module ported with it (imports of
    them stay imports of them); ``served`` maps each ``flwr`` module fedcore serves
    to its names (:data:`FLOWER_NAMES`).
    """
    package = module.rpartition(".")[0]
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        statements = _port_statement(node, package, ported, served)
        if statements is None:
            continue
        assert node.end_lineno is not None
        assert node.end_col_offset is not None
        start = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        text = "; ".join(statements) + "\n" * (node.end_lineno - node.lineno)
        edits.append((start, end, text))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _port_statement(
    node: ast.Import | ast.ImportFrom,
    package: str,
    ported: Collection[str],
    served: Mapping[str, Collection[str]],
) -> list[str] | None:
    """The statements that replace ``node``, or None to keep it as it is."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _is_flower(alias.name) and alias.name not in served:
                raise PortError(f"line {node.lineno}: import {alias.name} names no served module")
        return None
    source = _absolute(node, package)
    if not _is_flower(source):
        return None
    if source in ported:
        return [f"from {_ported(source)} import {_names(node.names)}"]
    statements = []
    stand_ins = []
    for alias in node.names:
        if alias.name == "*":
            raise PortError(f"line {node.lineno}: from {source} import * cannot be ported")
        bound = alias.asname or alias.name
        submodule = f"{source}.{alias.name}"
        if submodule in ported:
            statements.append(f"from {_ported(source)} import {_names([alias])}")
        elif submodule in served:
            statements.append(f"import {submodule} as {bound}")
        elif (home := served_module(alias.name, source, served)) is not None:
            statements.append(f"from {home} import {_names([alias])}")
        else:
            stand_ins.append(f"{bound} = _flower_internal({submodule!r})")
    if stand_ins:
        statements.append(f"from {__name__} import flower_internal as _flower_internal")
        statements.extend(stand_ins)
    return statements


def _is_flower(module: str) -> bool:
    return module == "flwr" or module.startswith("flwr.")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    if node.level > len(parts):
        raise PortError(f"line {node.lineno}: a relative import above {package}")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _ported_path(path: str) -> str:
    return f"{PORTED_PACKAGE}/{path.removeprefix(FLOWER_SOURCE)}"


def _ported(module: str) -> str:
    return PORTED_PACKAGE + module.removeprefix("flwr")


def _names(aliases: Collection[ast.alias]) -> str:
    return ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in aliases)


@dataclass(frozen=True)
class FlowerTestOutcome:
    """How one of Flower's tests ended: ``passed``, ``failed`` (its call raised),
    ``error`` (its setup or teardown did) or ``skipped``; for the two failures, the
    qualified type and the text of the first exception."""

    outcome: str
    exception: str = ""
    message: str = ""


@dataclass(frozen=True)
class FlowerUnitRun:
    """Every test's outcome, by id (``common/message_test.py::test_x``, the path under
    Flower's package), and every test file that could not be collected, with why."""

    outcomes: dict[str, FlowerTestOutcome]
    uncollected: dict[str, str]
    files: list[str]


def run_flower_unit_tests(timeout: float = 300) -> FlowerUnitRun:
    """Take, port and run :data:`FLOWER_UNIT_TESTS` (see the module docstring).

    Raises :class:`~fedcore.testing.flower_repo.FlowerRepoUnavailable` without a
    clone of Flower's repository, and ``RuntimeError`` if pytest itself fails.
    """
    paths = flower_paths(FLOWER_UNIT_TESTS)
    helpers = flower_paths(FLOWER_UNIT_HELPERS)
    with tempfile.TemporaryDirectory(prefix="flower-unit-") as tmp:
        root = Path(tmp)
        extract_flower([*paths, *helpers], root / "flower")
        modules = {path: flower_module_name(path) for path in [*paths, *helpers]}
        tests = root / PORTED_PACKAGE
        for path, module in modules.items():
            target = tests / path.removeprefix(FLOWER_SOURCE)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = (root / "flower" / path).read_text(encoding="utf-8")
            target.write_text(port_module(source, module, set(modules.values())), "utf-8")
        for directory in {tests, *(p.parent for p in tests.rglob("*_test.py"))}:
            while directory != root:
                (directory / "__init__.py").touch()
                directory = directory.parent
        (root / "pytest.ini").write_text(_PYTEST_INI, encoding="utf-8")
        report = root / "report.json"
        done = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                *("-p", "fedcore.testing.flower_unit_plugin"),
                *("-c", str(root / "pytest.ini"), "--rootdir", str(root)),
                *(f"--ignore={_ported_path(path)}" for path in helpers),
                *("--continue-on-collection-errors", PORTED_PACKAGE),
            ],
            cwd=root,
            env={**os.environ, REPORT_ENV: str(report)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode not in (0, 1) or not report.exists():
            raise RuntimeError(
                f"pytest on Flower's unit tests exited {done.returncode}:\n"
                f"{done.stdout[-4000:]}{done.stderr[-4000:]}"
            )
        found = json.loads(report.read_text(encoding="utf-8"))
    prefix = f"{PORTED_PACKAGE}/"
    return FlowerUnitRun(
        outcomes={
            test.removeprefix(prefix): FlowerTestOutcome(**outcome)
            for test, outcome in found["outcomes"].items()
        },
        uncollected={path.removeprefix(prefix): why for path, why in found["uncollected"].items()},
        files=[path.removeprefix(FLOWER_SOURCE) for path in paths],
    )
