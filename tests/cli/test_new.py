"""``fedcore new``: the app directory it writes runs under ``fedcore simulate`` and
``fedcore run`` as it is, and passes the repository's linters; bad names are one line."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fedcore import __version__
from fedcore.apps import templates
from fedcore.apps.project import read_project
from fedcore.cli import new
from fedcore.testing.deployment import Deployment

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SUMMARY = re.compile(r"^3 rounds · 45 replies \(15 train, 30 evaluate\) · 0 failures · ", re.M)
"""The closing line of a template's run: 3 rounds, 5 of 10 nodes training, all evaluating."""
ACCURACY = re.compile(r"round 3/3: .*evaluate accuracy=([0-9.]+)")


def fedcore(cwd: Path, *args: str, timeout: float = 110.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "fedcore"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def new_app(parent: Path, name: str, template: str) -> Path:
    made = fedcore(parent, "new", name, "--template", template)
    assert made.returncode == 0, made.stderr
    assert f"fedcore simulate {name}" in made.stdout
    assert f"fedcore run {name}" in made.stdout
    return parent / name


def assert_one_line_usage_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ")
    for fragment in fragments:
        assert fragment in line


# ------------------------------------------------------------------ what it writes


@pytest.mark.parametrize("template", templates.TEMPLATES)
def test_each_template_declares_both_halves_a_config_and_a_node_count(
    tmp_path: Path, template: str
) -> None:
    written = templates.render("My-App", template, tmp_path, fedcore_version=__version__)

    app = tmp_path / "My-App"
    assert written[0] == app
    package = {"__init__.py", "task.py", "client_app.py", "server_app.py"}
    assert {p.relative_to(app).as_posix() for p in written[1:]} == {
        "pyproject.toml",
        *(f"my_app/{name}" for name in package),
    }
    project = read_project(app)
    assert project.server == "my_app.server_app:server"
    assert project.client == "my_app.client_app:client"
    assert project.config["num-server-rounds"] == 3
    assert project.simulation.nodes == 10
    declared = tomllib.loads((app / "pyproject.toml").read_text())["project"]
    assert declared["name"] == "My-App"
    needs = {"numpy": "numpy", "pytorch": "torch", "sklearn": "scikit-learn"}[template]
    named = [re.split(r"[\[<>=]", dependency)[0] for dependency in declared["dependencies"]]
    assert "fedcore" in named
    assert f"fedcore>={__version__}" in declared["dependencies"]
    assert needs in named


def test_the_wheel_ships_every_template_file() -> None:
    """Each file under fedcore/apps/templates/<kind>/ matches a package-data pattern."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = declared["package-data"]["fedcore.apps.templates"]
    root = REPO / "fedcore" / "apps" / "templates"
    shipped = {path for pattern in patterns for path in root.glob(pattern)}
    data = {p for p in root.rglob("*") if p.is_file() and p.parent != root}
    assert {p for p in data if "__pycache__" not in p.parts} <= shipped
    assert len(data) == 15  # pyproject.toml and four modules, for each of three templates


def test_the_written_out_templates_are_the_real_ones() -> None:
    assert new.TEMPLATES == templates.TEMPLATES
    assert new.DEFAULT_TEMPLATE == templates.DEFAULT_TEMPLATE


def test_help_explains_each_option(tmp_path: Path) -> None:
    shown = fedcore(tmp_path, "new", "--help")

    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "Usage: fedcore new [OPTIONS] NAME" in text
    assert "--template [numpy|pytorch|sklearn]" in text
    assert "--dir PARENT" in text
    assert "it becomes PARENT/NAME, which must not exist" in text
    assert "'sklearn' a scikit-learn linear classifier" in text


# ------------------------------------------------------------------ it runs as written


@pytest.mark.parametrize("backend", ["process", "inline"])
@pytest.mark.parametrize("template", ["numpy", "sklearn"])
def test_a_new_app_simulates_with_no_flags_and_learns(
    tmp_path: Path, template: str, backend: str
) -> None:
    new_app(tmp_path, "first-app", template)

    done = fedcore(tmp_path, "simulate", "first-app", "--backend", backend)

    assert done.returncode == 0, done.stderr
    assert "simulating 10 nodes (from [tool.fedcore.app.simulation])" in done.stderr
    assert SUMMARY.search(done.stdout), done.stdout
    [accuracy] = ACCURACY.findall(done.stderr)
    assert float(accuracy) >= 0.8


@pytest.mark.parametrize("template", templates.TEMPLATES)
def test_a_new_app_on_more_nodes_than_it_has_samples_trains_without_a_warning(
    tmp_path: Path, template: str
) -> None:
    # 6,000 partitions: more than the made-up data's 5,000 samples and the digits'
    # 1,797. A warning (a mean of an empty slice) is an error in the ClientApps here.
    if template == "pytorch":
        pytest.importorskip("torch")
    new_app(tmp_path, "many-app", template)
    config = "fraction-train=0.001 fraction-evaluate=0.001 num-server-rounds=1"
    done = subprocess.run(
        [str(BIN / "fedcore"), "simulate", "many-app", "--nodes", "6000", "--backend", "inline",
         "--no-save", "--run-config", config],
        capture_output=True, text=True, cwd=tmp_path, timeout=110, check=False,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "1 rounds · 12 replies (6 train, 6 evaluate) · 0 failures" in done.stdout
    [round_line] = [line for line in done.stderr.splitlines() if "round 1/1:" in line]
    assert "loss=" in round_line
    assert "nan" not in round_line, round_line  # every node had samples to learn from


def test_the_pytorch_app_simulates_where_torch_is_installed(tmp_path: Path) -> None:
    new_app(tmp_path, "torch-app", "pytorch")
    pytest.importorskip("torch")

    done = fedcore(tmp_path, "simulate", "torch-app")

    assert done.returncode == 0, done.stderr
    assert SUMMARY.search(done.stdout), done.stdout
    [accuracy] = ACCURACY.findall(done.stderr)
    assert float(accuracy) >= 0.8


@pytest.mark.timeout(180)
def test_a_new_app_runs_on_a_link_with_two_nodes(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for index in range(2):
            federation.start_node(f"partition-id={index} num-partitions=2")
        made = federation.fedcore("new", "deployed")
        assert made.returncode == 0, made.stderr

        done = federation.fedcore("run", "deployed", "--stream")

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run \d+ finished:completed", done.stderr)
    assert len(re.findall(r"round \d/3: ", done.stdout)) == 3


def test_the_rendered_code_passes_the_repository_s_ruff(tmp_path: Path) -> None:
    for kind in templates.TEMPLATES:
        templates.render(f"{kind}-app", kind, tmp_path, fedcore_version="0.1")
        app = str(tmp_path / f"{kind}-app")
        # The app's own package is first-party, fedcore a dependency like numpy.
        lint = ["--config", str(REPO / "pyproject.toml"), "--config", f"src=[{app!r}]"]
        for check in (["check", *lint], ["format", "--check", *lint]):
            ruff = subprocess.run(
                [str(BIN / "ruff"), *check, app], capture_output=True, text=True, check=False
            )
            assert ruff.returncode == 0, f"{kind}: {ruff.stdout}{ruff.stderr}"


@pytest.mark.slow  # mypy reads torch's types from cold: 50-90 s of CI's 20 minutes
@pytest.mark.timeout(300)
def test_the_rendered_code_passes_the_repository_s_mypy(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    kinds = [kind for kind in templates.TEMPLATES if kind != "pytorch"]
    if importlib.util.find_spec("torch") is not None:
        kinds.append("pytorch")  # its types come from torch itself
    packages = []
    for kind in kinds:
        templates.render(f"{kind}-app", kind, tmp_path, fedcore_version="0.1")
    for kind in kinds:
        packages += ["-p", f"{kind}_app"]
    config = tmp_path / "mypy.ini"
    # fedcore's strict setting; scikit-learn ships no types.
    config.write_text("[mypy]\nstrict = True\n[mypy-sklearn.*]\nignore_missing_imports = True\n")
    paths = [str(REPO), *(str(tmp_path / f"{kind}-app") for kind in kinds)]
    mypy = subprocess.run(
        [str(BIN / "mypy"), "--config-file", str(config), *packages],
        capture_output=True,
        text=True,
        check=False,
        env={"MYPYPATH": ":".join(paths), "PATH": str(BIN)},
        cwd=cache.mkdir("mypy-templates") if (cache := getattr(pytestconfig, "cache", None))
        else tmp_path,  # mypy's cache, kept between runs where pytest keeps one
    )  # fmt: skip
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("1st-app", "must start with a letter"),
        ("my.app", "must start with a letter"),
        ("my app", "must start with a letter"),
        ("Class", "a keyword"),
        ("numpy", "already importable here"),
    ],
)
def test_a_bad_name_is_one_line_and_writes_nothing(tmp_path: Path, name: str, said: str) -> None:
    done = fedcore(tmp_path, "new", name)

    assert_one_line_usage_error(done, repr(name), said)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")

    done = fedcore(tmp_path, "new", "taken", "--template", "sklearn")

    assert_one_line_usage_error(done, "taken already exists")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


def test_dir_writes_into_another_parent_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "apps").mkdir()
    made = fedcore(tmp_path, "new", "there", "--dir", "apps")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "apps" / "there" / "there" / "task.py").is_file()
    assert "fedcore simulate apps/there" in made.stdout

    missing = fedcore(tmp_path, "new", "nowhere", "--dir", "absent")
    assert_one_line_usage_error(missing, "--dir", "absent")
