"""Reading an app directory's pyproject: fedcore's tables, Flower's, and which one wins."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fedcore.apps.project import AppProject, SimulationDefaults, read_project
from fedcore.errors import AppLoadError

FLOWER = """\
[tool.flwr.app.components]
serverapp = "pkg.server_app:app"
clientapp = "pkg.client_app:app"
[tool.flwr.app.config]
num-server-rounds = 3
lr = 0.1
"""


def project(tmp_path: Path, text: str, federation: str | None = None) -> AppProject:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(text))
    return read_project(tmp_path, federation=federation)


def error(tmp_path: Path, text: str, federation: str | None = None) -> str:
    with pytest.raises(AppLoadError) as caught:
        project(tmp_path, text, federation)
    message = str(caught.value)
    assert "\n" not in message
    return message.replace(str(tmp_path / "pyproject.toml"), "pyproject.toml")


def test_flowers_tables_name_the_halves_and_the_config(tmp_path: Path) -> None:
    found = project(tmp_path, FLOWER)

    assert (found.server, found.client) == ("pkg.server_app:app", "pkg.client_app:app")
    assert found.config == {"num-server-rounds": 3, "lr": 0.1}
    assert found.simulation == SimulationDefaults()


def test_fedcores_table_wins_key_by_key(tmp_path: Path) -> None:
    found = project(
        tmp_path,
        FLOWER + '[tool.fedcore.app]\nclient = "mine:client"\n[tool.fedcore.app.config]\nx = 1\n',
    )

    assert (found.server, found.client) == ("pkg.server_app:app", "mine:client")
    assert found.config == {"x": 1}  # the whole table: Flower's keys are not mixed in


def test_the_default_federation_gives_nodes_and_resources(tmp_path: Path) -> None:
    found = project(
        tmp_path,
        FLOWER
        + """
        [tool.flwr.federations]
        default = "local-sim"
        [tool.flwr.federations.local-sim]
        options.num-supernodes = 50
        options.backend.client-resources.num-cpus = 2
        options.backend.client-resources.num-gpus = 0.25
        [tool.flwr.federations.remote]
        address = "127.0.0.1:9093"
        """,
    )

    assert found.simulation == SimulationDefaults(
        50, 2.0, 0.25, nodes_from="[tool.flwr.federations.local-sim]"
    )


def test_a_federation_asked_for_by_name_and_fedcores_keys_over_it(tmp_path: Path) -> None:
    text = FLOWER + textwrap.dedent("""
        [tool.flwr.federations]
        default = "local-sim"
        [tool.flwr.federations.local-sim]
        options.num-supernodes = 10
        [tool.flwr.federations.gpu]
        options.num-supernodes = 20
        options.backend.client-resources.num-gpus = 1
        [tool.fedcore.app.simulation]
        num-cpus = 4
        """)

    assert project(tmp_path, text, "gpu").simulation == SimulationDefaults(
        20, 4.0, 1.0, nodes_from="[tool.flwr.federations.gpu]"
    )
    assert project(tmp_path, text).simulation.nodes == 10
    assert project(tmp_path, text).simulation.num_cpus == 4.0


def test_a_remote_federation_supplies_nothing(tmp_path: Path) -> None:
    found = project(
        tmp_path,
        FLOWER
        + '[tool.flwr.federations]\ndefault = "r"\n[tool.flwr.federations.r]\naddress = "x"\n',
    )

    assert found.simulation == SimulationDefaults()


@pytest.mark.parametrize(
    ("text", "federation", "message"),
    [
        (
            '[project]\nname = "x"\n',
            None,
            "pyproject.toml has no [tool.fedcore.app] table, nor [tool.flwr.app.components]",
        ),
        (
            '[tool.flwr.app.components]\nserverapp = "a:s"\n',
            None,
            '[tool.flwr.app.components] in pyproject.toml needs clientapp = "module:attr"',
        ),
        (
            "[tool.fedcore.app.simulation]\nnodes = 2\n",
            None,
            '[tool.fedcore.app] in pyproject.toml needs server = "module:attr"',
        ),
        (
            FLOWER + '[tool.flwr.federations]\ndefault = "nope"\n[tool.flwr.federations.a]\n',
            None,
            "pyproject.toml: default = 'nope', but [tool.flwr.federations] has no such federation "
            "(it declares a)",
        ),
        (FLOWER, "gpu", "pyproject.toml has no [tool.flwr.federations] table to take 'gpu' from"),
        (
            FLOWER + "[tool.flwr.federations]\n[tool.flwr.federations.a]\n",
            "b",
            "pyproject.toml: --federation b, but [tool.flwr.federations] has no such federation "
            "(it declares a)",
        ),
        (
            FLOWER + '[tool.flwr.federations]\ndefault = "a"\n[tool.flwr.federations.a]\n'
            "options.num-supernodes = 2.5\n",
            None,
            "pyproject.toml: [tool.flwr.federations.a] options.num-supernodes must be an "
            "integer >= 1, got 2.5",
        ),
        (
            FLOWER + "[tool.fedcore.app.simulation]\nnum-cpus = 0\n",
            None,
            "pyproject.toml: [tool.fedcore.app.simulation] num-cpus must be a number > 0, got 0",
        ),
        (
            FLOWER + '[tool.fedcore.app.simulation]\nnum-gpus = "1"\n',
            None,
            "pyproject.toml: [tool.fedcore.app.simulation] num-gpus must be a number >= 0, got '1'",
        ),
        (
            FLOWER + "[tool.fedcore.app.simulation]\nnodes-count = 3\n",
            None,
            "pyproject.toml: [tool.fedcore.app.simulation] has unknown key 'nodes-count' "
            "(it takes nodes, num-cpus, num-gpus)",
        ),
        (
            "[tool.flwr.app]\nconfig = 3\n[tool.flwr.app.components]\n"
            'serverapp = "a:s"\nclientapp = "a:c"\n',
            None,
            "pyproject.toml: [tool.flwr.app.config] must be a table",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_the_file_and_table(
    tmp_path: Path, text: str, federation: str | None, message: str
) -> None:
    assert error(tmp_path, text, federation) == message


def test_a_pyproject_that_is_not_utf8_is_an_app_load_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(b'[project]\nname = "caf\xe9"\n')
    with pytest.raises(AppLoadError) as caught:
        read_project(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'pyproject.toml'} is not UTF-8 (byte 21): invalid continuation byte"
    )
