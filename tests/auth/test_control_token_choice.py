"""Which control token a command sends: --token-file, then the environment, then the file
of a link started here with the default work directory (for a link on loopback only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.auth.control_token import TOKEN_ENV, client_token, link_token_file
from fedcore.auth.secret_files import read_secret
from fedcore.errors import UsageError
from fedcore.runtime.addresses import Address

LOOPBACK = Address("127.0.0.1", 9093)
REMOTE = Address("10.1.2.3", 9093)


def _token_file(path: Path, token: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A directory where a link with the default work directory has made its token."""
    read_secret(tmp_path / ".fedcore-link" / "control.token", what="control token")
    return tmp_path


def _default_token(here: Path) -> str:
    return (here / ".fedcore-link" / "control.token").read_text().strip()


def test_the_token_file_comes_first(here: Path) -> None:
    given = _token_file(here / "given.token", "f" * 40)
    found = client_token(given, link=LOOPBACK, environ={TOKEN_ENV: "e" * 40}, cwd=here)
    assert found.token == "f" * 40
    assert found.source == f"--token-file {given}"


def test_then_the_environment(here: Path) -> None:
    found = client_token(None, link=LOOPBACK, environ={TOKEN_ENV: " " + "e" * 40 + "\n"}, cwd=here)
    assert found.token == "e" * 40
    assert found.source == f"${TOKEN_ENV}"


def test_then_the_default_work_directory_here(here: Path) -> None:
    found = client_token(None, link=LOOPBACK, environ={}, cwd=here)
    assert found.token == _default_token(here)
    assert found.source == str(here / ".fedcore-link" / "control.token")
    # An empty variable counts as unset.
    assert client_token(None, link=LOOPBACK, environ={TOKEN_ENV: ""}, cwd=here) == found
    localhost = Address("localhost", 9093)
    assert client_token(None, link=localhost, environ={}, cwd=here).token == found.token


def test_a_link_on_another_machine_is_never_sent_this_machines_token(here: Path) -> None:
    found = client_token(None, link=REMOTE, environ={}, cwd=here)
    assert found.token is None
    assert "--token-file" in found.hint
    assert TOKEN_ENV in found.hint
    # Given explicitly, it is sent: the person chose it.
    assert client_token(None, link=REMOTE, environ={TOKEN_ENV: "e" * 40}, cwd=here).token


def test_nothing_found_sends_none_and_says_how_to_give_one(tmp_path: Path) -> None:
    found = client_token(None, link=LOOPBACK, environ={}, cwd=tmp_path)
    assert found.token is None
    assert found.hint.startswith("no token was sent: give --token-file")
    assert "\n" not in found.hint


def test_a_refused_token_s_hint_names_where_it_came_from(here: Path) -> None:
    found = client_token(None, link=LOOPBACK, environ={TOKEN_ENV: "e" * 40}, cwd=here)
    assert found.hint.startswith(f"the token from ${TOKEN_ENV} is not this link's")
    assert "e" * 40 not in found.hint


def test_a_missing_or_short_token_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read the control token file .*nope\.token"):
        client_token(tmp_path / "nope.token", link=LOOPBACK, environ={}, cwd=tmp_path)
    short = _token_file(tmp_path / "short.token", "abc")
    with pytest.raises(UsageError, match="too short"):
        client_token(short, link=LOOPBACK, environ={}, cwd=tmp_path)
    assert not (tmp_path / "nope.token").exists(), "a client never makes a token"


def test_the_link_keeps_its_token_in_its_work_directory_unless_told(tmp_path: Path) -> None:
    assert link_token_file(tmp_path) == tmp_path / "control.token"
    assert link_token_file(tmp_path, tmp_path / "elsewhere") == tmp_path / "elsewhere"
