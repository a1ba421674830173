"""``fedcore simulate`` on Flower app directories, as whole processes: tables, shim, defaults.

The apps are Flower's: ``tests/apps/flower_style`` is written as Flower's examples are
(Flower's tables only, ``import flwr`` throughout), and Flower's own examples come
from a clone of Flower's repository (``tests/flower_apps``). ``flwr`` is not installed
here, so every ``import flwr`` they make is answered by fedcore's shim, in the engine
and in the workers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedcore.testing.flower_examples import flower_example_or_skip

TESTS = Path(__file__).resolve().parents[1]
FLOWER_STYLE = TESTS / "apps" / "flower_style"
FEDCORE = Path(sys.executable).parent / "fedcore"

pytestmark = pytest.mark.timeout(120)


def simulate(
    app_dir: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", str(app_dir), "--seed", "0", *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
        env=env,
        check=False,
    )


def report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON line the flower-style ServerApp prints."""
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    found: dict[str, Any] = json.loads(line)
    return found


@pytest.fixture
def app_copy(tmp_path: Path) -> Path:
    """The flower-style app, copied: a run leaves nothing in the repository."""
    return Path(shutil.copytree(FLOWER_STYLE, tmp_path / "flower-style"))


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_flower_app_runs_as_it_is_with_its_federations_node_count(
    app_copy: Path, tmp_path: Path, backend: str
) -> None:
    done = simulate(app_copy, "--backend", backend, cwd=tmp_path)

    # 3 nodes: [tool.flwr.federations.local-sim], the default; 2 rounds adding 0.5 each.
    assert report(done) == {"nodes": 3, "weights": [1.0, 1.0, 1.0]}
    assert "simulating 3 nodes (from [tool.flwr.federations.local-sim])" in done.stderr
    assert "flower-style: final weights [1.0, 1.0, 1.0]" in done.stderr  # logger.log(INFO)


def test_federation_picks_another_entry_and_nodes_wins_over_both(
    app_copy: Path, tmp_path: Path
) -> None:
    bigger = simulate(app_copy, "--backend", "inline", "--federation", "bigger", cwd=tmp_path)
    given = simulate(app_copy, "--backend", "inline", "--nodes", "2", cwd=tmp_path)

    assert report(bigger)["nodes"] == 5
    assert report(given)["nodes"] == 2
    assert "simulating 2 nodes on the inline backend" in given.stderr


def test_fedcores_simulation_table_wins_over_the_flower_federation(
    app_copy: Path, tmp_path: Path
) -> None:
    pyproject = app_copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n[tool.fedcore.app.simulation]\nnodes = 4\n")

    done = simulate(app_copy, "--backend", "inline", cwd=tmp_path)

    assert report(done)["nodes"] == 4
    assert "simulating 4 nodes (from [tool.fedcore.app.simulation])" in done.stderr


def test_an_installed_flwr_package_does_not_change_what_the_app_gets(
    app_copy: Path, tmp_path: Path
) -> None:
    # A stand-in for Flower installed beside fedcore: importing it would fail loudly.
    fake = tmp_path / "site" / "flwr"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("the installed flwr was imported")\n')
    (fake / "app.py").write_text('raise RuntimeError("the installed flwr.app was imported")\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake.parent)}
    check = subprocess.run(
        [sys.executable, "-c", "import flwr"], env=env, capture_output=True, text=True, check=False
    )
    assert "the installed flwr was imported" in check.stderr  # it is on the path

    done = simulate(app_copy, "--backend", "process", cwd=tmp_path, env=env)

    assert report(done) == {"nodes": 3, "weights": [1.0, 1.0, 1.0]}


def test_a_flower_name_fedcore_lacks_fails_at_import_in_one_line(
    app_copy: Path, tmp_path: Path
) -> None:
    client = app_copy / "flower_style" / "client_app.py"
    client.write_text(
        client.read_text().replace("import flwr\n", "from flwr.common import EventType\n")
    )

    done = simulate(app_copy, "--backend", "inline", cwd=tmp_path)

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: cannot load ClientApp 'flower_style.client_app:app': FlowerImportError: "
        "flwr.common.EventType is a Flower name that fedcore does not support yet "
        "(flower_style/client_app.py:3)"
    ]


def test_a_flower_module_fedcore_lacks_fails_at_import_in_one_line(
    app_copy: Path, tmp_path: Path
) -> None:
    server = app_copy / "flower_style" / "server_app.py"
    server.write_text("import flwr.superlink\n" + server.read_text())

    done = simulate(app_copy, "--backend", "inline", cwd=tmp_path)

    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.endswith(
        "FlowerImportError: flwr.superlink is a Flower name that fedcore does not support yet "
        "(flower_style/server_app.py:1)"
    )


def test_an_app_that_declares_no_node_count_is_a_usage_error(tmp_path: Path) -> None:
    app_dir = flower_example_or_skip("quickstart-numpy", tmp_path / "flower")

    done = simulate(app_dir, cwd=tmp_path)

    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: how many nodes to simulate? pass --nodes N")


def test_import_flwr_elsewhere_is_untouched(tmp_path: Path) -> None:
    # fedcore imported, even its app loading, but no app loaded: flwr is not installed.
    code = (
        "import fedcore, fedcore.apps.loading, fedcore.simulation.simulate\n"
        "try:\n    import flwr\nexcept ModuleNotFoundError as exc:\n    print(exc.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )

    assert done.stdout == "flwr\n"


def test_a_resource_flag_replaces_only_its_own_default(tmp_path: Path) -> None:
    from fedcore.cli.simulate import _resources
    from fedcore.simulation import Resources

    app_dir = tmp_path / "app"
    shutil.copytree(FLOWER_STYLE, app_dir)
    pyproject = app_dir / "pyproject.toml"
    text = pyproject.read_text() + "options.backend.client-resources.num-gpus = 0.25\n"
    pyproject.write_text(text)  # appended to [tool.flwr.federations.bigger]

    assert _resources(str(app_dir), None, None, None) is None  # the simulation reads both
    assert _resources(str(app_dir), "bigger", 2.0, None) == Resources(2.0, 0.25)
    assert _resources(str(app_dir), None, None, 0.5) == Resources(1.0, 0.5)  # local-sim's cpus
    assert _resources("module:app", None, 3.0, None) == Resources(3.0, 0.0)
