"""``fedcore serve --role ROLE``: a dispatcher to one command per role.

Its help explains every option, each role's help those of the role; an option of
another role is refused, naming the role's help; the role's flags are checked by the
runtime's flag objects, whose refusals are one-line usage errors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedcore.cli import cli
from fedcore.cli.serve_options import OPTIONS, ROLES, options_of
from fedcore.errors import UsageError
from fedcore.runtime.serve import ExecFlags, LinkFlags, NodeFlags


def _help(*args: str) -> str:
    result = CliRunner().invoke(cli, ["serve", *args, "--help"], terminal_width=10_000)
    assert result.exit_code == 0, result.output
    return result.output


def _words(text: str) -> str:
    return " ".join(text.split())


def _lines(text: str, flag: str) -> list[str]:
    return [line for line in text.splitlines() if line.split()[:1] == [flag]]


def test_serve_help_explains_every_option_of_every_role() -> None:
    text = _help()
    assert "--role [link|node|exec]" in text
    for _, option in OPTIONS:
        assert option.help is not None
        assert len(_lines(text, option.opts[0])) == 1, option.name
        assert _words(option.help) in _words(text), option.name


@pytest.mark.parametrize("role", ROLES)
def test_a_role_s_help_explains_its_options_and_no_others(role: str) -> None:
    text = _help("--role", role)
    assert f" serve --role {role} [OPTIONS]" in text.splitlines()[0]
    mine = options_of(role)
    for _, option in OPTIONS:
        listed = _lines(text, option.opts[0])
        if option in mine:
            assert option.help is not None
            assert len(listed) == 1, option.name
            assert _words(option.help) in _words(text), option.name
        else:
            assert listed == [], option.name


def test_serve_without_a_role_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["serve", "--link", "127.0.0.1:9092"])
    assert result.exit_code == 2
    assert "Missing option '--role'" in result.output


@pytest.mark.parametrize(
    ("role", "flag"), [("link", "--link"), ("node", "--database"), ("exec", "--max-concurrent")]
)
def test_an_option_of_another_role_is_refused(role: str, flag: str) -> None:
    result = CliRunner().invoke(cli, ["serve", "--role", role, flag, "x"])
    assert result.exit_code == 2
    assert f"No such option '{flag}'" in result.output
    assert f"serve --role {role} --help" in result.output


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (lambda: LinkFlags(ssl_certfile=Path("c.pem")), "--ssl-certfile and --ssl-keyfile"),
        (
            lambda: LinkFlags(control_ssl_keyfile=Path("k.pem")),
            "--control-ssl-certfile and --control-ssl-keyfile",
        ),
        (lambda: NodeFlags(), "--role node needs --link HOST:PORT"),
        (lambda: NodeFlags(link="10.1.2.3:9092"), "needs TLS"),
        (lambda: NodeFlags(link="bad"), "--link 'bad' must be HOST:PORT"),
        (
            lambda: NodeFlags(link="127.0.0.1:9092", ssl_certfile=Path("c"), ssl_keyfile=Path("k")),
            "a client certificate needs --root-certificates",
        ),
        (
            lambda: NodeFlags(link="127.0.0.1:9092", exec_socket=Path("s")),
            "--exec-socket needs --exec-secret-file",
        ),
        (
            lambda: NodeFlags(link="127.0.0.1:9092", exec_socket=Path("s"), app_user="nobody"),
            "--app-user is for a link",
        ),
        (lambda: ExecFlags(), "--role exec needs --link-exec HOST:PORT"),
        (
            lambda: ExecFlags(link_exec="127.0.0.1:1", exec_socket=Path("s")),
            "an exec serves a link (--link-exec) or a node (--exec-socket), not both",
        ),
        (
            lambda: ExecFlags(
                link_exec="127.0.0.1:1", exec_secret_file=Path("s"), runtime_address="x"
            ),
            "--runtime-address 'x' must be HOST:PORT",
        ),
        (lambda: LinkFlags(app_env=("FEDCORE_X",)), "--app-env"),
    ],
)
def test_the_flag_objects_refuse_what_does_not_go_together(flags: object, error: str) -> None:
    with pytest.raises(UsageError, match=re.escape(error)):
        flags()  # type: ignore[operator]


def test_a_refusal_is_a_one_line_usage_error_naming_the_role_s_help() -> None:
    result = CliRunner().invoke(cli, ["serve", "--role", "exec", "--link-exec", "127.0.0.1:1"])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.output
    assert "--exec-secret-file" in error[0]
    assert "Traceback" not in result.output
