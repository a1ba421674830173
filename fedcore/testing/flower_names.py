"""Flower's public names, read from Flower's own files, never by importing Flower.

The tests of fedcore's import hook (:mod:`fedcore.apps.flower_imports`) check it
serves every name Flower offers apps, taking the list from Flower rather than from a
copy kept here, so a name Flower adds fails a test instead of a user's app:

- :class:`FlowerWheel` reads Flower's wheel (``$FEDCORE_FLOWER_WHEEL``: the release
  ``tests/flower-wheel.txt`` pins, which ``make test`` downloads) as a zip: the ``__all__``
  of a module, and what kind of thing each name is (:data:`Kind`), from the statement
  that defines it, following the wheel's own re-exports;
- :func:`example_imports` reads every ``flwr`` name each of Flower's example apps
  refers to, at :data:`~fedcore.testing.flower_repo.FLOWER_COMMIT` of the clone
  ``$FEDCORE_FLOWER_REPO`` names; :func:`uses_legacy_api` tells the apps written
  against Flower's legacy API (``NumPyClient``, ``client_fn``, ``flwr.server.strategy``…).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
import typing
import zipfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from fedcore.testing.flower_repo import FLOWER_COMMIT, FLOWER_REPO_ENV

FLOWER_WHEEL_ENV = "FEDCORE_FLOWER_WHEEL"
GET_THE_WHEEL = (
    f"set {FLOWER_WHEEL_ENV} to the wheel file of the Flower release tests/flower-wheel.txt "
    "pins (make test downloads it; by hand: pip download --no-deps flwr==VERSION -d DIR)"
)
APP_MODULES = (
    "flwr.app",
    "flwr.serverapp",
    "flwr.serverapp.strategy",
    "flwr.clientapp",
    "flwr.clientapp.mod",
)
"""Flower's modules for apps of its Message API; fedcore serves all their names."""

Kind = Literal["class", "function", "constant", "type alias", "module"]


class FlowerWheel:
    """A Flower wheel, read as the zip it is."""

    def __init__(self, path: Path) -> None:
        with zipfile.ZipFile(path) as wheel:
            self._files = {
                name: wheel.read(name).decode() for name in wheel.namelist() if name.endswith(".py")
            }

    def public_names(self, module: str) -> list[str]:
        """``module``'s ``__all__``, as its source spells it."""
        for statement in _statements(self._tree(module)):
            if isinstance(statement, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__all__"
                for target in statement.targets
            ):
                names: list[str] = ast.literal_eval(statement.value)
                return names
        raise LookupError(f"{module} in the wheel has no __all__")

    def kind(self, module: str, name: str) -> Kind | None:
        """What ``module.name`` is, from the statement that defines it; ``None`` where
        that is outside Flower or is not one of the simple forms."""
        if self._is_module(f"{module}.{name}"):
            return "module"
        for statement in _statements(self._tree(module)):
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                return "class"
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                if statement.name == name:
                    return "function"
            elif isinstance(statement, ast.Assign | ast.AnnAssign) and name in _targets(statement):
                return self._value_kind(module, statement.value)
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, statement)
                        if source == "flwr" or source.startswith("flwr."):
                            return self.kind(source, alias.name)
                        return None
        return None

    def _value_kind(self, module: str, value: ast.expr | None) -> Kind | None:
        if isinstance(value, ast.Constant):
            return "constant"
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
            return "type alias"
        if isinstance(value, ast.Subscript):
            return "type alias"
        if isinstance(value, ast.Name):
            return self.kind(module, value.id)
        return None

    def _tree(self, module: str) -> ast.Module:
        return ast.parse(self._files[self._path(module)])

    def _path(self, module: str) -> str:
        base = module.replace(".", "/")
        for path in (f"{base}/__init__.py", f"{base}.py"):
            if path in self._files:
                return path
        raise LookupError(f"the wheel has no module {module}")

    def _is_module(self, module: str) -> bool:
        base = module.replace(".", "/")
        return f"{base}/__init__.py" in self._files or f"{base}.py" in self._files

    def _absolute(self, module: str, statement: ast.ImportFrom) -> str:
        """The module a ``from … import`` in ``module`` imports from."""
        if not statement.level:
            return statement.module or ""
        package = module.split(".")
        if not self._path(module).endswith("__init__.py"):
            package = package[:-1]
        package = package[: len(package) - (statement.level - 1)]
        return ".".join([*package, *filter(None, [statement.module])])


def _statements(body: ast.Module) -> Iterator[ast.stmt]:
    """A module's top-level statements, those under its ``if``/``try`` blocks included."""
    pending: list[ast.stmt] = list(body.body)
    while pending:
        statement = pending.pop(0)
        yield statement
        if isinstance(statement, ast.If):
            pending.extend([*statement.body, *statement.orelse])
        elif isinstance(statement, ast.Try):
            pending.extend([*statement.body, *statement.orelse, *statement.finalbody])
            pending.extend(item for handler in statement.handlers for item in handler.body)


def _targets(statement: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def flower_wheel() -> FlowerWheel:
    """The wheel ``$FEDCORE_FLOWER_WHEEL`` names (``LookupError`` when it names none)."""
    path = os.environ.get(FLOWER_WHEEL_ENV)
    if not path:
        raise LookupError(GET_THE_WHEEL)
    return FlowerWheel(Path(path))


# Flower's example apps.

LEGACY_NAMES = frozenset(
    {
        "Client",
        "LegacyContext",
        "NumPyClient",
        # The legacy API's container of serialised arrays (fedrag keeps its texts in one).
        "Parameters",
        "ServerAppComponents",
        "ServerConfig",
        "run_simulation",
        "start_client",
        "start_numpy_client",
        "start_server",
        "start_simulation",
    }
)
"""Names only an app written against Flower's legacy API imports."""
LEGACY_MODULES = ("flwr.server.strategy", "flwr.server.workflow", "flwr.simulation")
LEGACY_KEYWORDS = frozenset({"client_fn", "server_fn"})
"""``ClientApp(client_fn=…)``, ``ServerApp(server_fn=…)``: the legacy way to make the apps."""


def example_imports() -> dict[str, set[str]]:
    """Each of Flower's example apps -> the dotted ``flwr`` names its Python files refer
    to: each ``from M import N`` as ``M.N``, ``import flwr…`` and the attribute chains
    read off it (``fl.server.strategy.FedAvg``) in full, ``client_fn=`` keywords as
    ``client_fn``. ``LookupError`` when ``$FEDCORE_FLOWER_REPO`` names no clone that
    has :data:`FLOWER_COMMIT`."""
    repo = os.environ.get(FLOWER_REPO_ENV)
    if not repo:
        raise LookupError(f"set {FLOWER_REPO_ENV} to a clone of adap/flower")
    listing = subprocess.run(
        ["git", "-C", repo, "ls-tree", "-r", FLOWER_COMMIT, "examples"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:
        raise LookupError(f"{repo} has no examples at {FLOWER_COMMIT[:10]}")
    files = {}
    for line in listing.stdout.splitlines():
        meta, _, path = line.partition("\t")
        if path.endswith(".py") and meta.split()[1] == "blob":
            files[path] = meta.split()[2]
    blobs = subprocess.run(
        ["git", "-C", repo, "cat-file", "--batch"],
        input="\n".join(files.values()).encode(),
        capture_output=True,
        check=True,
    ).stdout
    names: dict[str, set[str]] = defaultdict(set)
    for path, text in zip(files, _batch_contents(blobs), strict=True):
        names[path.split("/")[1]] |= flower_references(text)
    return dict(names)


def _batch_contents(output: bytes) -> Iterator[str]:
    """The contents of ``git cat-file --batch``'s answers, in order."""
    at = 0
    while at < len(output):
        header_end = output.index(b"\n", at)
        size = int(output[at:header_end].split()[2])
        yield output[header_end + 1 : header_end + 1 + size].decode()
        at = header_end + 1 + size + 1


def flower_references(source: str) -> set[str]:
    """The dotted ``flwr`` names ``source`` refers to (see :func:`example_imports`)."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # a local name bound to a flwr module, by `import`
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "flwr" or node.module.startswith("flwr."):
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flwr" or alias.name.startswith("flwr."):
                    found.add(alias.name)
                    local = alias.asname or alias.name.split(".")[0]
                    aliases[local] = alias.name if alias.asname else "flwr"
        elif isinstance(node, ast.keyword) and node.arg in LEGACY_KEYWORDS:
            found.add(node.arg)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _chain(node, aliases)
            if chain:
                found.add(chain)
    return found


def _chain(node: ast.Attribute, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` read as a dotted flwr name, if ``a`` is bound to a flwr module."""
    parts: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name) or value.id not in aliases:
        return None
    return ".".join([aliases[value.id], *reversed(parts)])


def uses_legacy_api(references: set[str]) -> bool:
    """Whether an app that refers to ``references`` is written against Flower's legacy API."""
    return any(
        reference in LEGACY_KEYWORDS
        or reference.rpartition(".")[2] in LEGACY_NAMES
        or any(reference.startswith(f"{module}.") for module in LEGACY_MODULES)
        for reference in references
    )


def kind_of(value: object) -> Kind:
    """What ``value``, a name fedcore serves, is, in :class:`FlowerWheel`'s terms."""
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if isinstance(value, types.UnionType | types.GenericAlias) or typing.get_origin(value):
        return "type alias"
    if callable(value):
        return "function"
    return "constant"


def forget_flower_imports() -> None:
    """This process's ``flwr`` shim and every ``flwr`` module it served, gone (for tests
    that install it afresh)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_FlowerFinder"]
    for name in [n for n in sys.modules if n == "flwr" or n.startswith("flwr.")]:
        del sys.modules[name]
