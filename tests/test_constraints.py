"""constraints.txt pins what ``make`` installs, and agrees with pyproject.toml's ranges.

``make lock`` writes constraints.txt; nothing checks by hand that it was re-run after
pyproject.toml changed. These tests do, with no network: every package fedcore's
extras of ``make test`` need, directly or through another package, has one pin, the pin
satisfies every range that asks for the package, and the environment the tests run in
has the pinned version (``make test``'s venv; another environment skips that last check).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, equals, version = line.partition("==")
        assert equals, f"{path.name}: {line!r} is not an exact pin"
        key = canonicalize_name(name)
        assert key not in pins, f"{path.name} pins {name} twice"
        pins[key] = Version(version)
    return pins


def _test_extras() -> set[str]:
    found = re.search(r"^TEST_EXTRAS\s*:=\s*(\S+)", MAKEFILE.read_text(), re.MULTILINE)
    assert found, "the Makefile names the extras make test installs in TEST_EXTRAS"
    return set(found.group(1).split(","))


def _requirements(distribution: str, extras: set[str]) -> list[Requirement]:
    """``distribution``'s installed requirements that apply here, with ``extras``."""
    wanted = []
    for text in metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker is None:
            wanted.append(requirement)
            continue
        environments = [default_environment() | {"extra": extra} for extra in extras or {""}]
        if any(requirement.marker.evaluate(env) for env in environments):
            wanted.append(requirement)
    return wanted


def _closure() -> dict[str, list[Requirement]]:
    """Every package make test installs -> the requirements that ask for it."""
    asked: dict[str, list[Requirement]] = {}
    queue = [("fedcore", _test_extras())]
    seen: set[str] = set()
    while queue:
        distribution, extras = queue.pop()
        for requirement in _requirements(distribution, extras):
            key = canonicalize_name(requirement.name)
            asked.setdefault(key, []).append(requirement)
            if key not in seen:
                seen.add(key)
                queue.append((requirement.name, set(requirement.extras)))
    return asked


@pytest.fixture
def asked() -> dict[str, list[Requirement]]:
    """:func:`_closure`, or the test skipped where make test's packages are not installed."""
    try:
        return _closure()
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"this environment lacks {exc.name}: not the one make test builds")


def test_every_package_make_test_installs_is_pinned_within_its_ranges(
    asked: dict[str, list[Requirement]],
) -> None:
    pins = _pins(ROOT / "constraints.txt")
    unpinned = sorted(set(asked) - set(pins))
    assert not unpinned, f"not in constraints.txt (run make lock): {unpinned}"
    outside = [
        f"{name}=={pins[name]} but {requirement} asks otherwise"
        for name, requirements in asked.items()
        for requirement in requirements
        if not requirement.specifier.contains(pins[name], prereleases=True)
    ]
    assert not outside, f"constraints.txt is behind pyproject.toml (run make lock): {outside}"


def test_the_environment_has_the_pinned_versions(asked: dict[str, list[Requirement]]) -> None:
    pins = _pins(ROOT / "constraints.txt")
    differ = {
        name: f"{metadata.version(name)} installed, {pins.get(name)} pinned"
        for name in asked
        if Version(metadata.version(name)) != pins.get(name)
    }
    assert not differ, f"this environment is not the pinned one: {differ}"


def test_the_flower_bench_environment_is_pinned_to_the_release_the_names_test_reads() -> None:
    flower = _pins(ROOT / "benchmarks" / "flower-constraints.txt")
    wheel = (ROOT / "tests" / "flower-wheel.txt").read_text()
    release = re.search(r"^flwr==(\S+)", wheel, re.MULTILINE)
    assert release, "tests/flower-wheel.txt pins flwr"
    assert flower["flwr"] == Version(release.group(1))
