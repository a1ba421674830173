"""Run configuration: the app's declared defaults, and the overrides a user asks for.

An app directory declares its keys and their defaults under
``[tool.fedcore.app.config]``; overrides (``--run-config "k=v k2=v2"`` or a dict)
may only change declared keys, and keep each key's type: an ``int`` default takes
``3`` but not ``0.5``. An app given as ``module:attr`` declares nothing and
accepts any key. Nested TOML tables become dotted keys (``[...config.model]`` →
``model.depth``), as in Flower.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

from fedcore.errors import RunConfigError

RunConfig = dict[str, Any]
_SCALARS = (bool, int, float, str)


def flatten(table: Mapping[str, Any], prefix: str = "") -> RunConfig:
    """Nested tables to dotted keys, checking every value is a bool, int, float or str."""
    flat: RunConfig = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, _SCALARS):
            flat[name] = value
        else:
            raise RunConfigError(
                f"run-config key {name!r} has a {type(value).__name__}; "
                "values must be bool, int, float or str"
            )
    return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys back to nested tables, :func:`flatten` undone (Flower's ``unflatten_dict``).

    Apps that keep a nested config (``train.lr``, ``train.epochs``) read
    ``context.run_config`` through this. A key that is both a value and a table
    (``a`` and ``a.b``) is refused rather than one of them silently lost.
    """
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *tables, last = key.split(".")
        level = nested
        for depth, part in enumerate(tables):
            level = level.setdefault(part, {})
            if not isinstance(level, dict):
                raise RunConfigError(_both(".".join(tables[: depth + 1])))
        if last in level and isinstance(level[last], dict):
            raise RunConfigError(_both(key))
        level[last] = value
    return nested


def _both(key: str) -> str:
    return f"run-config key {key!r} is both a value and a table of keys under it"


def parse_run_config(text: str) -> dict[str, str]:
    """Split ``'k=v k2="two words"'`` into raw text values, keyed by name.

    Items are separated by whitespace outside quotes; quotes stay in the value
    (``k2`` maps to ``'"two words"'``), so that a quoted value reads as a TOML
    string later: ``k="3"`` is the text ``3``, ``k=3`` the number.
    """
    words = _split_words(text)
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RunConfigError(f"run-config items look like key=value; got {word!r}")
        pairs[key] = value
    return pairs


def _split_words(text: str) -> list[str]:
    """Whitespace-separated words; a quoted part (``"..."`` with backslash escapes, or
    ``'...'``) keeps its quotes and its spaces."""
    words: list[str] = []
    word: list[str] = []
    quote = ""
    escaped = False
    for char in text:
        if quote:
            word.append(char)
            if escaped:
                escaped = False
            elif quote == '"' and char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char.isspace():
            if word:
                words.append("".join(word))
                word = []
        else:
            word.append(char)
            if char in "\"'":
                quote = char
    if quote:
        raise RunConfigError(f"cannot parse run-config {text!r}: no closing {quote}")
    if word:
        words.append("".join(word))
    return words


def _from_text(key: str, text: str) -> Any:
    """A raw value read as TOML (``3``, ``0.1``, ``true``, ``"s"``), or else as a plain string."""
    if "\n" in text or "\r" in text:
        return text  # one TOML value never spans lines; do not read "1\nx = 2" as 1
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if not isinstance(value, _SCALARS):
        raise RunConfigError(f"run-config {key}={text} is not a bool, int, float or str")
    return value


def _read(key: str, text: str, default: Any) -> Any:
    """A command-line value: text for a ``str`` key (unless quoted TOML), else a TOML value."""
    if isinstance(default, str):
        try:
            parsed = _from_text(key, text)
        except RunConfigError:  # TOML, but a date or list: still text for a str key
            return text
        return parsed if isinstance(parsed, str) else text
    return _from_text(key, text)


def _check_type(key: str, value: Any, default: Any) -> Any:
    if default is None:
        if not isinstance(value, _SCALARS):
            raise RunConfigError(
                f"run-config {key} must be a bool, int, float or str, got {type(value).__name__}"
            )
        return value
    expected = type(default)
    if type(value) is expected or (expected is float and type(value) is int):
        return expected(value)
    raise RunConfigError(
        f"run-config {key} expects {expected.__name__} (default {default!r}), got {value!r}"
    )


def resolve_run_config(
    defaults: Mapping[str, Any] | None, overrides: Mapping[str, Any] | str | None
) -> RunConfig:
    """The run config: ``defaults`` with ``overrides`` applied.

    ``overrides`` is a mapping of Python values, checked against the defaults' types,
    or command-line text (``'k=v k2="two words"'``) whose values are read as TOML —
    except for keys whose default is a ``str``, which take the text as it is. With no
    declared defaults (``None``), any key is accepted.
    """
    from_text = isinstance(overrides, str)
    pairs = parse_run_config(overrides) if isinstance(overrides, str) else flatten(overrides or {})
    if defaults is not None:
        unknown = sorted(set(pairs) - set(defaults))
        if unknown:
            declared = ", ".join(sorted(defaults)) or "no keys"
            raise RunConfigError(
                f"unknown run-config key {', '.join(map(repr, unknown))}; "
                f"the app declares {declared} in [tool.fedcore.app.config]"
            )
    config = dict(defaults or {})
    for key, value in pairs.items():
        default = None if defaults is None else defaults[key]
        config[key] = _check_type(key, _read(key, value, default) if from_text else value, default)
    return config
