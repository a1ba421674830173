"""A link serving its control API behind a bearer token, and the CLI presenting it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

pytestmark = pytest.mark.timeout(120)


def test_the_control_api_needs_the_token_from_the_file(tmp_path: Path) -> None:
    token_file = tmp_path / "control.token"
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link("--control-token-file", str(token_file))
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
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
