"""Loading apps from ``module:attr`` and app directories; every failure one clear AppLoadError."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedcore.apps.app import App
from fedcore.apps.client_app import ClientApp
from fedcore.apps.loading import LoadedApp, load_app
from fedcore.apps.server_app import ServerApp
from fedcore.domain import Context, Message
from fedcore.errors import AppLoadError, UsageError

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"
PREFIX = "fcload_"
NO_APP_TABLE = "pyproject.toml has no [tool.fedcore.app] table, nor [tool.flwr.app.components]"

APP_SOURCE = """\
import types

import fedcore as fc

server = fc.ServerApp()
client = fc.ClientApp()


@server.main()
async def main(grid, context):
    return "done"


app = fc.App(server=server, client=client)
apps = types.SimpleNamespace(main=app)
number = 42
nothing = None
"""

WriteModule = Callable[..., str]


def unique(stem: str = "mod") -> str:
    """A module name no other test uses, so nothing comes from a previous import."""
    return f"{PREFIX}{stem}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Restore sys.path and forget the modules this test imported."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    importlib.invalidate_caches()
    yield
    for name in [name for name in sys.modules if name.startswith(PREFIX)]:
        del sys.modules[name]


@pytest.fixture
def write_module(tmp_path: Path) -> WriteModule:
    """Write ``source`` as a uniquely named module under ``directory``; return its name."""

    def write(source: str = APP_SOURCE, directory: Path = tmp_path, stem: str = "mod") -> str:
        name = unique(stem)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def load_error(target: str | Path, cwd: Path | None = None) -> str:
    with pytest.raises(AppLoadError) as caught:
        load_app(target, cwd=cwd)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ module:attr


def test_module_attr_loads_from_the_current_directory(
    in_tmp: Path, write_module: WriteModule
) -> None:
    name = write_module()

    loaded = load_app(f"{name}:app")

    assert loaded == LoadedApp(
        sys.modules[name].app, config=None, path=None, client_ref=f"{name}:app.client"
    )
    assert isinstance(loaded.app, App)


def test_the_client_of_an_app_object_is_found_by_name(
    in_tmp: Path, write_module: WriteModule
) -> None:
    source = APP_SOURCE + "\n@client.query()\ndef query(msg, context):\n    return msg\n"
    name = write_module(source)
    app = load_app(f"{name}:app").app

    assert load_app(app).client_ref == f"{name}:client"


def test_a_client_made_inside_a_function_has_no_reference() -> None:
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        raise NotImplementedError

    assert load_app(App(server=ServerApp(), client=client)).client_ref is None


def test_module_attr_loads_relative_to_an_explicit_cwd(
    tmp_path: Path, write_module: WriteModule
) -> None:
    name = write_module()

    loaded = load_app(f"{name}:app", cwd=tmp_path)

    assert loaded.app is sys.modules[name].app


def test_module_attr_follows_dotted_attributes(in_tmp: Path, write_module: WriteModule) -> None:
    name = write_module()

    assert load_app(f"{name}:apps.main").app is sys.modules[name].app


def test_module_attr_loads_from_a_package(in_tmp: Path, write_module: WriteModule) -> None:
    package = unique("pkg")
    (in_tmp / package).mkdir()
    (in_tmp / package / "__init__.py").write_text("")
    (in_tmp / package / "app.py").write_text(APP_SOURCE)

    loaded = load_app(f"{package}.app:app")

    assert loaded.app is sys.modules[f"{package}.app"].app


def test_an_app_object_is_taken_as_is() -> None:
    app = App(server=ServerApp(), client=ClientApp())

    assert load_app(app) == LoadedApp(app)


@pytest.mark.parametrize(
    ("attr", "described"),
    [("number", "an int"), ("server", "a ServerApp"), ("nothing", "None")],
)
def test_an_attr_that_is_not_an_app_is_refused(
    in_tmp: Path, write_module: WriteModule, attr: str, described: str
) -> None:
    name = write_module()

    assert load_error(f"{name}:{attr}") == f"'{name}:{attr}' is {described}, not an App"


def test_a_missing_attr_is_named(in_tmp: Path, write_module: WriteModule) -> None:
    name = write_module()

    message = load_error(f"{name}:ap")

    assert message == f"cannot load App '{name}:ap': {name} has no 'ap'"


def test_a_missing_module_is_one_line_naming_the_target(in_tmp: Path) -> None:
    name = unique("missing")

    message = load_error(f"{name}:app")

    assert message == f"cannot load App '{name}:app': ModuleNotFoundError: No module named '{name}'"


def test_a_missing_module_never_points_into_fedcore_itself() -> None:
    """Run from fedcore's checkout, fedcore's own files are under the search path."""
    name = unique("missing")

    message = load_error(f"{name}:app", cwd=REPO)

    assert message.endswith(f"No module named '{name}'")
    assert "loading.py" not in message


def test_an_import_that_raises_names_the_error_and_the_line(
    in_tmp: Path, write_module: WriteModule
) -> None:
    name = write_module("import fedcore\n\nratio = 1 / 0\n")

    message = load_error(f"{name}:app")

    assert message == (
        f"cannot load App '{name}:app': ZeroDivisionError: division by zero ({name}.py:3)"
    )


def test_an_import_error_points_at_the_deepest_user_line(
    in_tmp: Path, write_module: WriteModule
) -> None:
    helper = write_module("def load():\n    raise OSError('data/train.csv not found')\n")
    name = write_module(f"import {helper}\n\n\n{helper}.load()\n")

    message = load_error(f"{name}:app")

    assert message.endswith(f"OSError: data/train.csv not found ({helper}.py:2)")


def test_a_missing_dependency_of_the_app_points_at_its_import(
    in_tmp: Path, write_module: WriteModule
) -> None:
    dependency = unique("dependency")
    name = write_module(f"import os\nimport {dependency}\n")

    message = load_error(f"{name}:app")

    assert message.endswith(f"No module named '{dependency}' ({name}.py:2)")


def test_the_cause_of_an_import_failure_is_kept(in_tmp: Path, write_module: WriteModule) -> None:
    name = write_module("raise RuntimeError('boom')\n")

    with pytest.raises(AppLoadError) as caught:
        load_app(f"{name}:app")

    assert isinstance(caught.value.__cause__, RuntimeError)


def test_a_target_that_is_neither_a_directory_nor_module_attr_is_refused(in_tmp: Path) -> None:
    message = load_error("no_such_app")

    assert message.startswith("'no_such_app' is neither an app directory nor a module:attr")


@pytest.mark.parametrize("target", [":app", "module:"])
def test_a_half_empty_reference_is_refused(in_tmp: Path, target: str) -> None:
    assert load_error(target) == f"{target!r} is not a module:attr reference"


def test_load_errors_are_usage_errors(in_tmp: Path) -> None:
    with pytest.raises(UsageError):
        load_app("no_such_app")


# ------------------------------------------------------------------ app directories


def pyproject(body: str) -> str:
    return textwrap.dedent(body).lstrip()


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    path = tmp_path / "my-app"
    path.mkdir()
    return path


@pytest.fixture
def app_module(app_dir: Path, write_module: WriteModule) -> str:
    """A module with an App, its ServerApp and ClientApp, inside the app directory."""
    return write_module(directory=app_dir)


def write_pyproject(app_dir: Path, module: str, extra: str = "") -> None:
    (app_dir / "pyproject.toml").write_text(
        pyproject(f"""
            [project]
            name = "my-app"

            [tool.fedcore.app]
            server = "{module}:server"
            client = "{module}:client"
        """)
        + textwrap.dedent(extra)
    )


def test_an_app_directory_loads_its_halves_and_config(app_dir: Path, app_module: str) -> None:
    write_pyproject(
        app_dir,
        app_module,
        """
        [tool.fedcore.app.config]
        num-server-rounds = 3
        learning-rate = 0.1
        use-gpu = false
        name = "mlp"
        """,
    )

    loaded = load_app(app_dir)

    module = sys.modules[app_module]
    assert loaded.app.server is module.server
    assert loaded.app.client is module.client
    assert loaded.config == {
        "num-server-rounds": 3,
        "learning-rate": 0.1,
        "use-gpu": False,
        "name": "mlp",
    }
    assert loaded.path == app_dir.resolve()


def test_nested_config_tables_become_dotted_keys(app_dir: Path, app_module: str) -> None:
    write_pyproject(
        app_dir,
        app_module,
        """
        [tool.fedcore.app.config]
        rounds = 2
        [tool.fedcore.app.config.model]
        depth = 4
        [tool.fedcore.app.config.model.head]
        units = 10
        """,
    )

    assert load_app(app_dir).config == {"rounds": 2, "model.depth": 4, "model.head.units": 10}


def test_an_app_directory_without_config_declares_no_keys(app_dir: Path, app_module: str) -> None:
    write_pyproject(app_dir, app_module)

    assert load_app(app_dir).config == {}


def test_a_relative_app_directory_is_found_from_cwd(
    tmp_path: Path, app_dir: Path, app_module: str
) -> None:
    write_pyproject(app_dir, app_module)

    assert load_app("my-app", cwd=tmp_path).path == app_dir.resolve()


def test_an_app_directory_imports_from_itself_not_the_cwd(
    in_tmp: Path, app_dir: Path, app_module: str
) -> None:
    write_pyproject(app_dir, app_module)

    loaded = load_app(app_dir)

    assert sys.modules[app_module].__file__ == str(app_dir / f"{app_module}.py")
    assert loaded.app.server is sys.modules[app_module].server


def test_an_app_directory_without_pyproject_is_refused(app_dir: Path) -> None:
    message = load_error(app_dir)

    assert message == f"{app_dir.resolve()} has no pyproject.toml; an app directory needs one"


def test_a_pyproject_without_the_app_table_is_refused(app_dir: Path) -> None:
    (app_dir / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.other]\na = 1\n')

    message = load_error(app_dir)

    assert message.endswith(NO_APP_TABLE)


@pytest.mark.parametrize(
    "text",
    ['[tool]\nfedcore = "app"\n', "[tool.fedcore]\napp = 3\n", "tool = []\n"],
    ids=["fedcore-not-a-table", "app-not-a-table", "tool-not-a-table"],
)
def test_a_misshapen_tool_table_is_refused(app_dir: Path, text: str) -> None:
    (app_dir / "pyproject.toml").write_text(text)

    assert load_error(app_dir).endswith(NO_APP_TABLE)


def test_a_config_that_is_not_a_table_is_refused(app_dir: Path, app_module: str) -> None:
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = "{app_module}:server"\nclient = "{app_module}:client"\n'
        "config = 3\n"
    )

    assert load_error(app_dir).endswith(": [tool.fedcore.app.config] must be a table")


@pytest.mark.parametrize("half", ["server", "client"])
def test_a_missing_half_is_refused(app_dir: Path, app_module: str, half: str) -> None:
    other = "client" if half == "server" else "server"
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\n{other} = "{app_module}:{other}"\n'
    )

    message = load_error(app_dir)

    assert message == (
        f'[tool.fedcore.app] in {app_dir.resolve() / "pyproject.toml"} needs {half} = "module:attr"'
    )


def test_a_half_that_is_not_a_string_is_refused(app_dir: Path, app_module: str) -> None:
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = 3\nclient = "{app_module}:client"\n'
    )

    assert load_error(app_dir).endswith('needs server = "module:attr"')


def test_invalid_toml_is_refused(app_dir: Path) -> None:
    (app_dir / "pyproject.toml").write_text("[tool.fedcore.app\nserver = \n")

    message = load_error(app_dir)

    assert message.startswith(f"{app_dir.resolve() / 'pyproject.toml'} is not valid TOML: ")


def test_a_config_value_of_an_unsupported_type_is_refused(app_dir: Path, app_module: str) -> None:
    write_pyproject(app_dir, app_module, "[tool.fedcore.app.config]\nlayers = [1, 2]\n")

    message = load_error(app_dir)

    assert "run-config key 'layers' has a list" in message
    assert "values must be bool, int, float or str" in message


def test_a_server_ref_naming_a_client_app_is_refused(app_dir: Path, app_module: str) -> None:
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = "{app_module}:client"\nclient = "{app_module}:client"\n'
    )

    assert load_error(app_dir) == f"'{app_module}:client' is a ClientApp, not a ServerApp"


def test_a_client_ref_to_a_missing_module_names_the_client(app_dir: Path, app_module: str) -> None:
    missing = unique("missing")
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = "{app_module}:server"\nclient = "{missing}:client"\n'
    )

    message = load_error(app_dir)

    assert message.startswith(f"cannot load ClientApp '{missing}:client': ModuleNotFoundError")


def test_the_quickstart_example_loads_with_its_declared_config() -> None:
    loaded = load_app(QUICKSTART)

    assert loaded.path == QUICKSTART.resolve()
    assert loaded.config == {
        "num-server-rounds": 30,
        "fraction-train": 0.1,
        "fraction-evaluate": 0.1,
        "local-epochs": 5,
        "batch-size": 32,
        "learning-rate": 0.5,
        "dirichlet-alpha": 0.5,
        "seed": 0,
    }
    assert loaded.app.client.message_types == ["train", "evaluate"]
