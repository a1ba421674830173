"""Loading an app from what a user typed: ``module:attr`` or an app directory.

``module:attr`` imports ``module`` (the current directory is importable) and takes
``attr``, which must be an :class:`~fedcore.apps.app.App`; an app directory's
``pyproject.toml`` is read by :mod:`fedcore.apps.project`. Before it imports anything
of the app, loading installs the ``flwr`` shim (:mod:`fedcore.apps.flower_imports`),
so the app's ``import flwr…`` get fedcore's names. Every failure is an
:class:`~fedcore.errors.AppLoadError` with a one-line message that names the target
and, for an import that raised, where in the user's code.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcore.apps.app import App
from fedcore.apps.client_app import ClientApp
from fedcore.apps.flower_imports import install_flower_imports
from fedcore.apps.project import SimulationDefaults, read_project
from fedcore.apps.run_config import RunConfig
from fedcore.apps.server_app import ServerApp
from fedcore.errors import AppLoadError

_FEDCORE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LoadedApp:
    """An app and what its target declared about it.

    ``config`` holds the declared run-config defaults; ``None`` means the target
    declares none (``module:attr``) and accepts any key. ``path`` is the app
    directory, or ``None``. ``client_ref`` is a ``module:attr`` that imports the
    ClientApp again — what worker processes load — or ``None`` when there is none
    (a ClientApp made inside a function, or in a notebook). ``simulation`` is what
    the app directory declares for ``fedcore simulate`` (nothing, for the others).
    """

    app: App
    config: RunConfig | None = None
    path: Path | None = None
    client_ref: str | None = None
    simulation: SimulationDefaults = field(default_factory=SimulationDefaults)


def load_app(
    target: str | Path | App, *, cwd: Path | None = None, federation: str | None = None
) -> LoadedApp:
    """Load an :class:`App` from an ``App``, a ``module:attr`` string or an app directory.

    ``federation`` picks the Flower federation an app directory's simulation defaults
    come from (see :mod:`fedcore.apps.project`).
    """
    if isinstance(target, App):
        return LoadedApp(target, client_ref=find_reference(target.client))
    base = Path.cwd() if cwd is None else cwd
    candidate = base / target
    if candidate.is_dir():
        return _load_app_dir(candidate.resolve(), federation)
    text = str(target)
    if ":" not in text:
        raise AppLoadError(
            f"{text!r} is neither an app directory nor a module:attr reference "
            "(e.g. examples/quickstart-numpy or my_app:app)"
        )
    app = load_object(text, base, App, "App")
    assert isinstance(app, App)
    return LoadedApp(app, client_ref=f"{text}.client")


def _load_app_dir(path: Path, federation: str | None) -> LoadedApp:
    project = read_project(path, federation=federation)
    server = load_object(project.server, path, ServerApp, "ServerApp")
    client = load_object(project.client, path, ClientApp, "ClientApp")
    assert isinstance(server, ServerApp)
    assert isinstance(client, ClientApp)
    return LoadedApp(
        App(server=server, client=client),
        project.config,
        path,
        project.client,
        project.simulation,
    )


def load_object(ref: str, search_path: Path, kind: type, kind_name: str) -> Any:
    """Import ``module:attr`` with ``search_path`` importable and check it is a ``kind``."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise AppLoadError(f"{ref!r} is not a module:attr reference")
    install_flower_imports()
    directory = str(search_path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppLoadError(
            f"cannot load {kind_name} {ref!r}: {_describe(exc, search_path)}"
        ) from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AppLoadError(
                f"cannot load {kind_name} {ref!r}: {module_name} has no {attr!r}"
            ) from None
    if not isinstance(found, kind):
        raise AppLoadError(
            f"{ref!r} is {_a(type(found).__name__)}, not {_a(kind_name)}"
            if found is not None
            else f"{ref!r} is None, not {_a(kind_name)}"
        )
    return found


def _a(name: str) -> str:
    """``name`` with its indefinite article: "an App", "a ServerApp", "an int"."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def find_reference(client: ClientApp) -> str | None:
    """A ``module:attr`` under which ``client`` is found again, or ``None``.

    Looks in the modules its handlers were defined in for a module-level name bound to
    the ClientApp, or to an App holding it. A script run as ``__main__`` counts when it
    has a file: worker processes started with "spawn" import it again.
    """
    for name in client.defining_modules:
        module = sys.modules.get(name)
        if module is None or (name == "__main__" and not getattr(module, "__file__", None)):
            continue
        for attr, value in vars(module).items():
            if value is client:
                return f"{name}:{attr}"
            if isinstance(value, App) and value.client is client:
                return f"{name}:{attr}.client"
    return None


def _describe(exc: Exception, search_path: Path) -> str:
    """``Type: message``, plus the last line of the user's code that the error passed through."""
    text = f"{type(exc).__name__}: {exc}"
    root = search_path.resolve()
    # Not the user's code: installed packages, and fedcore itself (which may live
    # under the search path, as in an editable install run from its checkout).
    foreign = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    foreign.add(_FEDCORE_DIR)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if not path.is_file():
            continue
        path = path.resolve()
        if path.is_relative_to(root) and not any(path.is_relative_to(p) for p in foreign):
            return f"{text} ({path.relative_to(root)}:{frame.lineno})"
    return text
