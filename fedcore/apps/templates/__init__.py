"""The app directories ``fedcore new`` writes: one template per kind of model.

Each template is a directory of package data beside this module, ``<kind>/``, whose
files end in ``.tmpl`` (so neither Python nor the linters take them for code of
fedcore's) and hold :class:`string.Template` placeholders: ``$name`` (the app's name as
given), ``$module`` (its package) and ``$fedcore_version``. A directory called
``package`` becomes the app's package. Rendering reads them through
:mod:`importlib.resources`, so an installed wheel renders what a checkout does.

The app written is complete: its ``pyproject.toml`` declares both halves, a small run
config and a node count, so ``fedcore simulate NAME`` runs it with no flag, and its
data is made up on the spot or ships with a dependency (nothing is downloaded).
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import shutil
import string
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from fedcore.errors import UsageError

TEMPLATES = ("numpy", "pytorch", "sklearn")
"""The kinds of app ``fedcore new --template`` writes."""
DEFAULT_TEMPLATE = "numpy"

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_SUFFIX = ".tmpl"
_PACKAGE = "package"


def module_name(name: str) -> str:
    """The app's package for ``name``: lowercased, ``-`` made ``_``; raises
    :class:`UsageError` for a name that cannot be one."""
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"app name {name!r} must start with a letter and hold only letters, digits, '-' and '_'"
        )
    module = name.lower().replace("-", "_")
    if keyword.iskeyword(module):
        raise UsageError(f"app name {name!r} would make a package named {module!r}, a keyword")
    if importlib.util.find_spec(module) is not None:
        # The app's package would shadow it (or be shadowed): `fedcore new numpy`
        # would leave an app that cannot import numpy.
        raise UsageError(
            f"app name {name!r} would make a package named {module!r}, which is "
            "already importable here; pick another name"
        )
    return module


def render(name: str, template: str, parent: Path, *, fedcore_version: str) -> list[Path]:
    """Write the ``template`` app called ``name`` into ``parent/name``; returns the files
    written, the directory's own path first. Blocks on file I/O.

    The app requires ``fedcore>=fedcore_version``: the version whose API it was written
    for (the caller's ``fedcore.__version__``; this layer does not import fedcore's top).

    Raises :class:`UsageError` for a bad name or template, or if ``parent/name`` exists.
    """
    if template not in TEMPLATES:
        raise UsageError(f"no template {template!r} (there are {', '.join(TEMPLATES)})")
    module = module_name(name)
    values = {"name": name, "module": module, "fedcore_version": fedcore_version}
    target = parent / name
    try:
        target.mkdir()
    except FileExistsError:
        raise UsageError(f"{target} already exists; pick another name or --dir") from None
    except FileNotFoundError:
        raise UsageError(f"cannot write {target}: {parent} does not exist") from None
    written = [target]
    try:
        for source, relative in _template_files(files(__name__) / template, ()):
            path = target.joinpath(*(module if part == _PACKAGE else part for part in relative))
            path.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text(encoding="utf-8")
            path.write_text(string.Template(text).substitute(values), encoding="utf-8")
            written.append(path)
    except BaseException:
        shutil.rmtree(target)  # never leave half an app behind
        raise
    return written


def _template_files(
    directory: Traversable, under: tuple[str, ...]
) -> list[tuple[Traversable, tuple[str, ...]]]:
    """Each ``.tmpl`` file under ``directory`` with its path there, suffix dropped, sorted."""
    found = []
    for entry in sorted(directory.iterdir(), key=lambda entry: entry.name):
        if entry.is_dir():
            found += _template_files(entry, (*under, entry.name))
        elif entry.name.endswith(_SUFFIX):
            found.append((entry, (*under, entry.name.removesuffix(_SUFFIX))))
    return found
