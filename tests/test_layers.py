"""Imports point downward (docs/architecture.md); each third-party library stays behind its door.

Each fedcore package may import only the packages listed for it below; a new package
must be added here, on purpose, before it can import anything. No two fedcore modules
import each other, however indirectly: an import inside a function counts (it runs),
one under ``if TYPE_CHECKING:`` does not (it never does).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedcore

ROOT = Path(fedcore.__file__).parent

BASE = {"errors", "clock", "backoff", "event_loop", "lazy", "non_dumpable", "defaults"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "clock": set(),
    "backoff": {"clock"},
    "event_loop": set(),
    "defaults": set(),
    "lazy": set(),
    "non_dumpable": set(),
    # clock: Message(...) stamps its creation time from the context's clock, as Flower's.
    "domain": {"errors", "lazy", "clock"},
    # defaults: the cap on a value that fedcore serve and simulate show (MAX_VALUE_LEN).
    "wire": {"errors", "domain", "defaults"},
    # wire: the frame a signature covers is a wire Buffer.
    "auth": BASE | {"wire"},
    "data": set(),
    "privacy": {"domain"},
    "privacy_accounting": {"errors"},
    "apps": BASE | {"domain"},
    "mods": {"errors", "domain", "wire", "apps", "privacy"},
    "state": BASE | {"domain", "wire"},
    # apps: a worker loads its ClientApp, in the environment of app processes.
    "workers": BASE | {"domain", "wire", "apps"},
    "strategy": BASE | {"domain", "apps", "privacy"},
    "transport": BASE | {"domain", "wire", "auth", "state", "apps"},
    "roles": BASE | {"domain", "wire", "auth", "state", "transport", "apps"},
    # strategy: a run's record holds the round driver's RoundReports and a Result's model;
    # wire: its round checkpoint is kept in the wire encoding of a RecordDict.
    "results": BASE | {"domain", "strategy", "wire"},
    # strategy: the progress display renders the round driver's RoundReports.
    "simulation": BASE
    | {"domain", "wire", "state", "transport", "apps", "strategy", "results", "workers"},
    # strategy: the ServerApp process reads its strategy's last RoundReport; results: it
    # reports the run's record in the form of a results directory.
    "runtime": BASE
    | {"domain", "wire", "auth", "state", "transport", "apps", "roles", "strategy", "results"}
    | {"workers"},
    # Flower's legacy API, translated onto the Message API: its apps, strategies and
    # start_simulation run on fedcore's own.
    "legacy": BASE | {"domain", "apps", "strategy", "simulation", "results", "privacy"},
    # Not roles nor transport: the runtime wires them (runtime/serve.py, control_client.py).
    "cli": BASE
    | {"domain", "wire", "auth", "state", "apps", "simulation", "runtime", "workers"}
    | {"strategy", "mods", "results", "legacy", "__init__"},
    "testing": BASE
    | {"domain", "wire", "auth", "state", "transport", "apps", "simulation", "strategy", "mods"}
    | {"runtime", "results", "legacy", "workers"},
    "__init__": {"apps", "domain", "simulation", "lazy"},
}

# Third-party modules that only some packages may import.
GUARDED: dict[str, set[str]] = {
    "msgpack": {"wire"},
    "cryptography": {"auth"},
    "betterproto": {"wire"},
    "grpclib": {"transport", "testing"},
    "aiohttp": {"transport"},
    "pytest": {"testing"},
    # The experiment trackers' libraries, each behind its module in results/trackers/.
    "mlflow": {"results"},
    "tensorboard": {"results"},
    "wandb": {"results"},
    # Google's privacy accounting, behind the accountant (the [dp] extra).
    "dp_accounting": {"privacy_accounting"},
    "anyio": set(ALLOWED) - {"domain", "wire", "data", "errors", "privacy", "privacy_accounting"},
}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "_pb" in parts:
            continue
        yield parts[0], path


def imports(path: Path) -> Iterator[str]:
    package = ".".join(("fedcore", *path.relative_to(ROOT).parent.parts))
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield f"{base}.{node.module}" if node.module else base
            elif node.module:
                yield node.module


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes under ``node`` that may run: all but the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _run_nodes(other)
            continue
        yield child
        yield from _run_nodes(child)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("fedcore", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def run_imports(source: str, package: str, known: set[str]) -> set[str]:
    """The fedcore modules in ``known`` that a module of ``package`` imports when it runs:
    ``from P import M`` is module ``P.M`` when that is one, else ``P`` itself."""
    names = set()
    for node in _run_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                names.add(submodule if submodule in known else module)
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each fedcore module and the fedcore modules it imports when it runs."""
    paths = {module_name(path): path for _, path in modules()}
    known = set(paths)
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = run_imports(path.read_text(encoding="utf-8"), package, known) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The modules that import each other, each group of them once (Tarjan's algorithm:
    the strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(start: str) -> None:
        # Iterative, so that a long chain of imports cannot exhaust Python's stack.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# Cycles in parts of fedcore being redrawn on other branches (issue #26), allowed here
# until those branches are merged; the lead empties this list at the merge.
KNOWN_CYCLES: set[frozenset[str]] = set()


def violations(layer: str, names: list[str]) -> list[str]:
    """The imported names that ``layer`` may not import."""
    bad = []
    for name in names:
        top, _, rest = name.partition(".")
        if top == "fedcore":
            target = rest.split(".")[0] or "__init__"
            if target != layer and target not in ALLOWED[layer]:
                bad.append(name)
        elif top in GUARDED and layer not in GUARDED[top]:
            bad.append(name)
    return bad


@pytest.mark.parametrize(("layer", "path"), list(modules()), ids=lambda v: str(v))
def test_imports_point_downward(layer: str, path: Path) -> None:
    assert layer in ALLOWED, f"package {layer!r} has no entry in ALLOWED"
    assert violations(layer, list(imports(path))) == []


def test_no_module_imports_itself_through_others() -> None:
    found = set(cycles(import_graph()))
    assert found - KNOWN_CYCLES == set(), "import cycles: " + "; ".join(
        " <-> ".join(sorted(group)) for group in found - KNOWN_CYCLES
    )
    assert KNOWN_CYCLES - found == set(), "no longer cycles: empty them from KNOWN_CYCLES"


def test_the_cycle_finder_finds_cycles_and_only_those() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [frozenset({"x", "y"})]


def test_imports_that_run_count_and_type_checking_ones_do_not() -> None:
    source = """
import fedcore.domain.records
from typing import TYPE_CHECKING
from fedcore.strategy import base, NotAModule
if TYPE_CHECKING:
    from fedcore.state import memory
else:
    from fedcore import errors
def later():
    from . import rounds
"""
    known = {
        "fedcore",
        "fedcore.domain",
        "fedcore.domain.records",
        "fedcore.errors",
        "fedcore.state",
        "fedcore.state.memory",
        "fedcore.strategy",
        "fedcore.strategy.base",
        "fedcore.strategy.rounds",
    }
    assert run_imports(source, "fedcore.strategy", known) == {
        "fedcore.domain.records",
        "fedcore.errors",
        "fedcore.strategy",
        "fedcore.strategy.base",
        "fedcore.strategy.rounds",
    }


def test_the_checker_catches_upward_and_guarded_imports() -> None:
    assert violations("domain", ["fedcore.state.memory", "msgpack", "numpy", "fedcore.errors"]) == [
        "fedcore.state.memory",
        "msgpack",
    ]
    assert violations("apps", ["fedcore", "anyio"]) == ["fedcore"]
    assert violations("domain", ["anyio.abc"]) == ["anyio.abc"]


def test_imports_are_read_from_source() -> None:
    names = list(imports(ROOT / "domain" / "records.py"))
    assert "numpy" in names
