"""``fedcore run / ls / log / stop / serve`` without a link: one-line errors and exit statuses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedcore.cli import main
from fedcore.testing.network import closed_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-numpy"


def _fedcore(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["fedcore", *args])
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", [["ls"], ["log", "7"], ["stop", "7"], ["ls", "--nodes"]])
def test_an_unreachable_link_is_one_line_and_status_1(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    code, err = _fedcore(monkeypatch, capsys, *command, "--link", f"127.0.0.1:{closed_port()}")
    assert code == 1
    assert err.startswith("error: the link at 127.0.0.1:")
    assert len(err.splitlines()) == 1


def test_a_bad_link_address_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _fedcore(monkeypatch, capsys, "ls", "--link", "nowhere")
    assert code == 2
    assert "--link 'nowhere' must be HOST:PORT" in err


def test_run_checks_the_app_and_its_config_before_contacting_the_link(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    link = f"127.0.0.1:{closed_port()}"
    code, err = _fedcore(monkeypatch, capsys, "run", str(tmp_path), "--link", link)
    assert (code, err.count("\n")) == (2, 1)
    assert "has no pyproject.toml" in err
    code, err = _fedcore(
        monkeypatch, capsys, "run", str(EXAMPLE), "--link", link, "--run-config", "rounds=3"
    )
    assert code == 2
    assert "unknown run-config key 'rounds'" in err


def test_serve_a_node_without_its_link_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _fedcore(monkeypatch, capsys, "serve", "--role", "node")
    assert code == 2
    assert "--role node needs --link HOST:PORT" in err
