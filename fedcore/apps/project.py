"""What an app directory's ``pyproject.toml`` declares: the one place that reads it.

An app directory names its two halves, its run-config defaults and, for
``fedcore simulate``, how many nodes to simulate and what each ClientApp needs.
fedcore's own tables come first, and a Flower app's tables stand in for any part they
leave out, so that a Flower app directory is an app directory as it is (the tables
side by side, and which wins: docs/from-flower.md, "How the app directory is read").
Reading never imports the app: the link checks bundles with it, and ``fedcore run``
packs with it. Every failure is an :class:`~fedcore.errors.AppLoadError` of one line
naming the file and the table.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.apps.run_config import RunConfig, flatten
from fedcore.errors import AppLoadError, RunConfigError

FEDCORE_TABLE = "[tool.fedcore.app]"
FLOWER_COMPONENTS = "[tool.flwr.app.components]"
_HALVES = (("server", "serverapp"), ("client", "clientapp"))


@dataclass(frozen=True)
class SimulationDefaults:
    """What an app declares for ``fedcore simulate``; ``None`` where it declares nothing.

    ``nodes_from`` names the table the node count came from, for messages.
    """

    nodes: int | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    nodes_from: str = ""


@dataclass(frozen=True)
class AppProject:
    """An app directory's declarations: ``server``/``client`` are ``module:attr``.

    ``name`` is what a deployed run's record calls the app: ``[project] name``, else the
    ServerApp's top-level package. It is read from the one file a bundle always carries,
    so the link, the ServerApp process and ``fedcore run`` all say the same.
    """

    pyproject: Path
    server: str
    client: str
    config: RunConfig
    simulation: SimulationDefaults
    name: str


def read_project(app_dir: Path, *, federation: str | None = None) -> AppProject:
    """Read ``app_dir/pyproject.toml``; ``federation`` picks a ``[tool.flwr.federations]``
    entry other than its ``default``. Blocks on file I/O; raises :class:`AppLoadError`."""
    pyproject = app_dir / "pyproject.toml"
    document = _load(app_dir, pyproject)
    fedcore = _table(document, "tool", "fedcore", "app")
    flower = _table(document, "tool", "flwr", "app")
    components = _table(flower, "components") if flower is not None else None
    if fedcore is None and components is None:
        raise AppLoadError(f"{pyproject} has no {FEDCORE_TABLE} table, nor {FLOWER_COMPONENTS}")
    server, client = (
        _reference(pyproject, fedcore, components, ours, theirs) for ours, theirs in _HALVES
    )
    return AppProject(
        pyproject,
        server,
        client,
        _config(pyproject, fedcore, flower),
        _simulation(pyproject, document, fedcore, federation),
        _name(document, server),
    )


def _name(document: dict[str, Any], server: str) -> str:
    project = _table(document, "project")
    declared = project.get("name") if project is not None else None
    if isinstance(declared, str) and declared.strip():
        return declared.strip()
    return server.partition(":")[0].split(".")[0]


def _load(app_dir: Path, pyproject: Path) -> dict[str, Any]:
    try:
        with pyproject.open("rb") as file:
            return tomllib.load(file)
    except (FileNotFoundError, NotADirectoryError):
        raise AppLoadError(f"{app_dir} has no pyproject.toml; an app directory needs one") from None
    except tomllib.TOMLDecodeError as exc:
        raise AppLoadError(f"{pyproject} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; tomllib lets this one through
        raise AppLoadError(f"{pyproject} is not UTF-8 (byte {exc.start}): {exc.reason}") from None


def _table(document: Any, *names: str) -> dict[str, Any] | None:
    """The table at ``names`` in ``document``, or ``None`` if absent or not a table."""
    table = document
    for name in names:
        table = table.get(name) if isinstance(table, dict) else None
    return table if isinstance(table, dict) else None


def _reference(
    pyproject: Path,
    fedcore: dict[str, Any] | None,
    components: dict[str, Any] | None,
    ours: str,
    theirs: str,
) -> str:
    if fedcore is not None and ours in fedcore:
        found, where, key = fedcore[ours], FEDCORE_TABLE, ours
    elif components is not None and theirs in components:
        found, where, key = components[theirs], FLOWER_COMPONENTS, theirs
    elif fedcore is not None:
        found, where, key = None, FEDCORE_TABLE, ours
    else:
        found, where, key = None, FLOWER_COMPONENTS, theirs
    if not isinstance(found, str) or not all(found.partition(":")[::2]):
        raise AppLoadError(f'{where} in {pyproject} needs {key} = "module:attr"')
    return found


def _config(
    pyproject: Path, fedcore: dict[str, Any] | None, flower: dict[str, Any] | None
) -> RunConfig:
    if fedcore is not None and "config" in fedcore:
        declared, where = fedcore["config"], "[tool.fedcore.app.config]"
    elif flower is not None and "config" in flower:
        declared, where = flower["config"], "[tool.flwr.app.config]"
    else:
        return {}
    if not isinstance(declared, dict):
        raise AppLoadError(f"{pyproject}: {where} must be a table")
    try:
        return flatten(declared)
    except RunConfigError as exc:
        raise AppLoadError(f"{pyproject}: {where}: {exc}") from None


_Found = tuple[Any, str, str]
"""A declared value, the table it is in, and its key there."""


def _simulation(
    pyproject: Path,
    document: dict[str, Any],
    fedcore: dict[str, Any] | None,
    federation: str | None,
) -> SimulationDefaults:
    """fedcore's ``simulation`` keys, each falling back to the Flower federation's."""
    picked = _federation_options(pyproject, document, federation)
    if fedcore is not None and "simulation" in fedcore:
        where = "[tool.fedcore.app.simulation]"
        table = fedcore["simulation"]
        if not isinstance(table, dict):
            raise AppLoadError(f"{pyproject}: {where} must be a table")
        unknown = sorted(set(table) - {"nodes", "num-cpus", "num-gpus"})
        if unknown:
            raise AppLoadError(
                f"{pyproject}: {where} has unknown key {unknown[0]!r} "
                "(it takes nodes, num-cpus, num-gpus)"
            )
        picked.update({key: (value, where, key) for key, value in table.items()})
    nodes = picked.get("nodes")
    cpus = picked.get("num-cpus")
    gpus = picked.get("num-gpus")
    return SimulationDefaults(
        nodes=None if nodes is None else _count(pyproject, *nodes),
        num_cpus=None if cpus is None else _amount(pyproject, *cpus, positive=True),
        num_gpus=None if gpus is None else _amount(pyproject, *gpus, positive=False),
        nodes_from="" if nodes is None else nodes[1],
    )


def _federation_options(
    pyproject: Path, document: dict[str, Any], asked: str | None
) -> dict[str, _Found]:
    """The chosen Flower federation's simulation options, under fedcore's key names."""
    federations = _table(document, "tool", "flwr", "federations")
    where = "[tool.flwr.federations]"
    if federations is None:
        if asked is not None:
            raise AppLoadError(f"{pyproject} has no {where} table to take {asked!r} from")
        return {}
    name = asked if asked is not None else federations.get("default")
    if name is None:
        return {}
    entry = federations.get(name) if isinstance(name, str) and name != "default" else None
    if not isinstance(entry, dict):
        declared = sorted(k for k, v in federations.items() if isinstance(v, dict))
        said = f"--federation {name}" if asked is not None else f"default = {name!r}"
        raise AppLoadError(
            f"{pyproject}: {said}, but {where} has no such federation "
            f"(it declares {', '.join(declared) or 'none'})"
        )
    here = f"[tool.flwr.federations.{name}]"
    options = _table(entry, "options") or {}
    resources = _table(options, "backend", "client-resources") or {}
    found: dict[str, _Found] = {}
    if "num-supernodes" in options:
        found["nodes"] = (options["num-supernodes"], here, "options.num-supernodes")
    for key in ("num-cpus", "num-gpus"):
        if key in resources:
            found[key] = (resources[key], here, f"options.backend.client-resources.{key}")
    return found


def _count(pyproject: Path, value: Any, table: str, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AppLoadError(f"{pyproject}: {table} {key} must be an integer >= 1, got {value!r}")
    return value


def _amount(pyproject: Path, value: Any, table: str, key: str, *, positive: bool) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise AppLoadError(f"{pyproject}: {table} {key} must be a number {bound}, got {value!r}")
    return float(value)
