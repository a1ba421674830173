"""Imports point downward (docs/architecture.md); each third-party library stays behind its door.

Each fedcore package may import only the packages listed for it below; a new package
must be added here, on purpose, before it can import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedcore

ROOT = Path(fedcore.__file__).parent

BASE = {"errors", "clock", "backoff", "signals", "lazy", "non_dumpable"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "clock": set(),
    "backoff": {"clock"},
    "signals": set(),
    "lazy": set(),
    "non_dumpable": set(),
    # clock: Message(...) stamps its creation time from the context's clock, as Flower's.
    "domain": {"errors", "lazy", "clock"},
    "wire": {"errors", "domain"},
    "data": set(),
    "privacy": {"domain"},
    "privacy_accounting": {"errors"},
    "apps": BASE | {"domain"},
    "mods": {"errors", "domain", "wire", "apps", "privacy"},
    "state": BASE | {"domain", "wire"},
    # apps: a worker loads its ClientApp, in the environment of app processes.
    "workers": BASE | {"domain", "wire", "apps"},
    "strategy": BASE | {"domain", "apps", "privacy"},
    "transport": BASE | {"domain", "wire", "state", "apps"},
    "roles": BASE | {"domain", "wire", "state", "transport", "apps"},
    # strategy: a run's record holds the round driver's RoundReports and a Result's model;
    # wire: its round checkpoint is kept in the wire encoding of a RecordDict.
    "results": BASE | {"domain", "strategy", "wire"},
    # strategy: the progress display renders the round driver's RoundReports.
    "simulation": BASE
    | {"domain", "wire", "state", "transport", "apps", "strategy", "results", "workers"},
    # strategy: the ServerApp process reads its strategy's last RoundReport; results: it
    # reports the run's record in the form of a results directory.
    "runtime": BASE
    | {"domain", "wire", "state", "transport", "apps", "roles", "simulation", "strategy"}
    | {"results", "workers"},
    # Flower's legacy API, translated onto the Message API: its apps, strategies and
    # start_simulation run on fedcore's own.
    "legacy": BASE | {"domain", "apps", "strategy", "simulation", "results", "privacy"},
    "cli": BASE
    | {"domain", "wire", "state", "transport", "apps", "roles", "simulation", "runtime"}
    | {"strategy", "mods", "results", "legacy", "workers", "__init__"},
    "testing": BASE
    | {"domain", "wire", "state", "transport", "apps", "simulation", "strategy", "mods"}
    | {"runtime", "results", "legacy", "workers"},
    "__init__": {"apps", "domain", "simulation", "lazy"},
}

# Third-party modules that only some packages may import.
GUARDED: dict[str, set[str]] = {
    "msgpack": {"wire"},
    "cryptography": {"wire"},
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
