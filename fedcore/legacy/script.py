"""Running a legacy Flower script, or a module, as Python would: ``fedcore simulate``'s
``script.py`` and ``-m package.main`` forms.

A script runs as ``__main__``, with ``sys.argv`` its path and arguments and its
directory first on ``sys.path`` (``python script.py``); a module runs as
``python -m`` runs it, with ``sys.argv[0]`` its file and the current directory first
on ``sys.path``. Its ``import flwr…`` statements get fedcore's names
(:func:`~fedcore.apps.flower_imports.install_flower_imports`), so its
``start_simulation`` is :func:`fedcore.legacy.simulation.start_simulation`. A Hydra
app finds its config directory as under ``python``: Hydra looks beside the file of
the decorated function, and reads its overrides from ``sys.argv``.

The script's exit status is the caller's to give the process: a ``SystemExit`` it
raises passes through, as does any other exception (shown as a traceback).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from fedcore.apps.flower_imports import install_flower_imports
from fedcore.errors import UsageError
from fedcore.legacy.simulation import ScriptDefaults, script_defaults


def run_script(path: str | Path, args: Sequence[str], defaults: ScriptDefaults) -> None:
    """Run the Python file ``path`` as ``__main__`` with ``args``, as ``python path args``."""
    script = Path(path)
    if not script.exists():
        raise UsageError(f"no such script: {str(path)!r}")
    if not script.is_file():
        raise UsageError(f"{str(path)!r} is not a Python file")
    directory = str(script.resolve().parent)
    with _running(str(script), args, directory, defaults):
        runpy.run_path(str(script), run_name="__main__")


def run_module(name: str, args: Sequence[str], defaults: ScriptDefaults) -> None:
    """Run the module ``name`` as ``__main__`` with ``args``, as ``python -m name args``."""
    cwd = os.getcwd()
    with _running(name, args, cwd, defaults):
        install_flower_imports()
        where = f"(looked in {cwd} and on sys.path)"
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError as exc:  # a package above it is missing
            if exc.name is None or not f"{name}.".startswith(f"{exc.name}."):
                raise  # its package's own code imports a module that is missing
            raise UsageError(f"no module named {name!r}: no {exc.name!r} {where}") from None
        except ValueError as exc:  # a relative name, or an empty one
            raise UsageError(f"cannot run module {name!r}: {exc}") from None
        if spec is None:
            raise UsageError(f"no module named {name!r} {where}")
        runpy.run_module(name, run_name="__main__", alter_sys=True)


@contextlib.contextmanager
def _running(
    argv0: str, args: Sequence[str], search: str, defaults: ScriptDefaults
) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as Python sets them for a program, and the
    simulation defaults, for the duration; restored after."""
    install_flower_imports()
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv[:] = [argv0, *args]
    sys.path.insert(0, search)
    try:
        with script_defaults(defaults):
            yield
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
