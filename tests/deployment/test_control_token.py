"""The control API is closed by default: a link started with no token flags makes a token in
its work directory and wants it on every route; strangers get 401; the CLI finds the token
on the same machine, and a refusal is one line naming the fix."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

CHAOS_APP = Path(__file__).resolve().parent / "chaos_app"

pytestmark = pytest.mark.timeout(120)


def _stranger(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """A request as anyone who can reach the address would make it: no token."""
    headers = {"Content-Type": "multipart/form-data; boundary=b"} if body is not None else {}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read()


def test_a_link_with_no_token_flags_refuses_strangers_on_every_route(tmp_path: Path) -> None:
    with Deployment(tmp_path) as deployment:
        link = deployment.start_link()
        deployment.start_node("partition-id=0")
        token_file = deployment.control_token_file
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        base = f"http://{link.address('control')}"
        bundle = (CHAOS_APP / "pyproject.toml").read_bytes()
        submission = b"--b\r\nContent-Disposition: form-data; name=config\r\n\r\n{}\r\n"
        submission += b"--b\r\nContent-Disposition: form-data; name=bundle\r\n\r\n"
        submission += bundle + b"\r\n--b--\r\n"
        for method, path, body in [
            ("GET", "/v1/nodes", None),
            ("POST", "/v1/runs", submission),
            ("GET", "/v1/runs", None),
            ("GET", "/v1/runs/1", None),
            ("POST", "/v1/runs/1/stop", b""),
            ("GET", "/v1/runs/1/logs", None),
        ]:
            status, answer = _stranger(method, base + path, body)
            assert status == 401, (method, path, answer)
            document = json.loads(answer)
            assert document["message"] == "a valid bearer token is required"
            assert token.encode() not in answer
        # Health tells a stranger that the link is up, and nothing else.
        assert _stranger("GET", base + "/v1/health") == (200, b'{"status":"ok"}')
        listed = deployment.fedcore("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [], "the refused submission made no run"
        nodes = deployment.fedcore("ls", "--nodes", "--json")
        assert len(json.loads(nodes.stdout)) == 1
    assert token not in link.output.read_text(), "the token is never logged"


def test_ls_on_the_link_s_machine_finds_the_work_dir_token_and_refuses_a_wrong_one(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path) as deployment:
        # Started where the commands run, with the default work directory (as the
        # README's one-machine lines do), the link's token is found with no flag at all.
        link = deployment.start_link(work_dir=tmp_path / ".fedcore-link")
        control = link.address("control")
        found = deployment.fedcore("ls", "--link", control, token=False)
        assert found.returncode == 0, found.stderr
        assert found.stdout.startswith("RUN ID")
        wrong = deployment.fedcore(
            "ls", "--link", control, env={"FEDCORE_CONTROL_TOKEN": "w" * 43}, token=False
        )
        assert wrong.returncode == 2
        assert "Traceback" not in wrong.stderr
        (line,) = wrong.stderr.splitlines()
        assert line.startswith(f"error: the link at {control} refused the request")
        assert "the token from $FEDCORE_CONTROL_TOKEN is not this link's" in line
        assert "--token-file" in line
        assert "w" * 43 not in line


def test_a_link_with_another_work_dir_needs_token_file_and_the_refusal_says_so(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path) as deployment:
        deployment.start_link()  # its work directory is not the default one here
        for command in (["ls"], ["ls", "--nodes"], ["log", "1"], ["stop", "1"]):
            refused = deployment.fedcore(*command, token=False)
            assert refused.returncode == 2, refused.stdout
            assert "Traceback" not in refused.stderr
            (line,) = refused.stderr.splitlines()
            assert "no token was sent: give --token-file" in line
        submitted = deployment.fedcore("run", str(CHAOS_APP), token=False)
        assert submitted.returncode == 2
        assert "no token was sent" in submitted.stderr
        token_file = str(deployment.control_token_file)
        listed = deployment.fedcore("ls", "--json", "--token-file", token_file, token=False)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [], "the refused submission made no run"
        missing = deployment.fedcore("ls", "--token-file", "nope.token", token=False)
        assert missing.returncode == 2
        (line,) = missing.stderr.splitlines()
        assert "cannot read the control token file nope.token" in line


def test_the_token_file_flag_puts_the_token_elsewhere(tmp_path: Path) -> None:
    token_file = tmp_path / "control.token"
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link("--control-token-file", str(token_file))
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert not deployment.control_token_file.exists()
        for env in ({}, {"FEDCORE_CONTROL_TOKEN": "x" * 43}):
            refused = deployment.fedcore("ls", env=env)
            assert refused.returncode != 0
            assert "token" in refused.stderr.lower()
            assert token not in refused.stderr
        listed = deployment.fedcore("ls", "--json", env={"FEDCORE_CONTROL_TOKEN": token})
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.strip() == "[]"
        assert deployment.link is not None
        assert token not in deployment.link.output.read_text()
