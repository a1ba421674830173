"""``fedcore serve --max-value-bytes``: refused in one line unless a positive integer,
described in ``--help``, and handed to the role it serves.

The roles themselves are stood in for: these tests check what the command gives them,
not what they do with it (tests/deployment/test_large_messages.py runs a real one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import fedcore.runtime.exec
import fedcore.runtime.link
import fedcore.runtime.node
import fedcore.runtime.serve as serve_runtime
from fedcore.cli import cli
from fedcore.wire import MAX_VALUE_LEN


@pytest.mark.parametrize("role", ["link", "node", "exec"])
@pytest.mark.parametrize("value", ["0", "-1", "1.5", "lots", ""])
def test_a_cap_that_is_not_a_positive_integer_is_a_one_line_usage_error(
    value: str, role: str
) -> None:
    result = CliRunner().invoke(cli, ["serve", "--role", role, "--max-value-bytes", value])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.output
    assert "'--max-value-bytes'" in error[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("role", [None, "link", "node", "exec"])
def test_help_says_what_the_cap_bounds_and_its_default(role: str | None) -> None:
    chosen = [] if role is None else ["--role", role]
    result = CliRunner().invoke(cli, ["serve", *chosen, "--help"], terminal_width=2000)
    assert result.exit_code == 0
    (text,) = [line for line in result.output.splitlines() if "--max-value-bytes" in line]
    assert "str or bytes value of a record" in text
    assert f"Default: {MAX_VALUE_LEN} (512 MiB" in text


class _Served:
    """Stands in for the roles' ``serve_*`` functions: keeps what each was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.options: Any = None
        for module, name in (
            (fedcore.runtime.link, "serve_link"),
            (fedcore.runtime.node, "serve_node"),
            (fedcore.runtime.exec, "serve_exec"),
        ):
            monkeypatch.setattr(module, name, self._keep)
        # What the command does to its own process (the umask, the spool directory,
        # serving until a signal) is not for the test's process.
        monkeypatch.setattr(serve_runtime.os, "umask", lambda mask: mask)
        monkeypatch.setattr(serve_runtime.logging, "basicConfig", lambda **kwargs: None)
        monkeypatch.setattr(serve_runtime, "_spool_in", lambda directory: None)
        monkeypatch.setattr(
            serve_runtime, "run_until_ended", lambda serve_role, *args, **kwargs: serve_role()
        )
        self._work_dir = tmp_path

    def _keep(self, options: Any) -> None:
        self.options = options

    def invoke(self, *args: str) -> Any:
        flags = ["--work-dir", str(self._work_dir), *args]
        result = CliRunner().invoke(cli, ["serve", *flags], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return self.options


@pytest.mark.parametrize("given", [None, 3 * 1024 * 1024])
def test_the_cap_reaches_the_link_the_node_and_the_exec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: int | None
) -> None:
    served = _Served(monkeypatch, tmp_path)
    flag = [] if given is None else ["--max-value-bytes", str(given)]
    wanted = MAX_VALUE_LEN if given is None else given
    link = served.invoke("--role", "link", "--fleet-address", "127.0.0.1:0", *flag)
    assert link.max_value_len == wanted
    assert link.launch.max_value_len == wanted
    node = served.invoke("--role", "node", "--link", "127.0.0.1:9092", *flag)
    assert node.max_value_len == wanted
    secret = tmp_path / "exec.secret"
    exec_ = served.invoke(
        "--role", "exec", "--link-exec", "127.0.0.1:9094", "--exec-secret-file", str(secret), *flag
    )
    assert exec_.launch.max_value_len == wanted
