"""Isolation below the API, on real processes: what an app process can read of its starters.

A link and two nodes (one starting its ClientApp processes itself, one through an
exec of its own), all started with a control token and an unrelated secret in their
environment and a permissive umask. The app reports the variables each of its
processes started with (``/proc/self/environ``, which any process of the same user
can read): none holds the token, the secret or the run's launch secret, and each
has what an app needs plus what ``--app-env`` passed on. And every file the link and
the nodes wrote is their user's only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

ENVIRON_APP = Path(__file__).resolve().parent / "environ_app"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_app_processes_start_with_no_secret_of_their_starters_and_files_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, permissive_umask: None
) -> None:
    monkeypatch.setenv("FEDCORE_CONTROL_TOKEN", "t" * 43)
    monkeypatch.setenv("CLOUD_SECRET_KEY", "s" * 40)
    monkeypatch.setenv("PASSED_ON", "1")
    monkeypatch.setenv("LC_TIME", "C")
    socket_path = tmp_path / "node-exec.sock"
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link("--app-env", "PASSED_ON")
        deployment.start_node("partition-id=0", "--app-env", "PASSED_ON")
        deployment.start_node_exec(socket_path, "--app-env", "PASSED_ON")
        deployment.start_node(
            "partition-id=1",
            "--exec-socket", str(socket_path),
            "--exec-secret-file", str(deployment.exec_secret_file),
        )  # fmt: skip
        final, reports = deployment.follow_printed(
            deployment.submit(ENVIRON_APP, **{"min-nodes": 2})
        )
        assert final["status"] == "finished:completed", final
        root = deployment.root
        database = {path.name for path in root.glob("link.db*")}
        assert database == {"link.db", "link.db-wal", "link.db-shm"}
        assert list((root / "link" / "runs").glob("*.out")), "no ServerApp output kept"
        for work_dir in ("link", "node0", "node1"):
            assert list((root / work_dir / "bundles").glob("*/environ_app/app.py")), work_dir
        written = [root / "link", root / "node0", root / "node1", *root.glob("link.db*")]
        modes = {str(path): oct(mode) for path, mode in _modes(written) if mode & 0o077}
    assert modes == {}, "readable by others"
    assert sorted(report["process"] for report in reports) == ["client", "client", "server"]
    for report in reports:
        names = set(report["names"])
        leaked = {"FEDCORE_CONTROL_TOKEN", "FEDCORE_RUN_SECRET", "CLOUD_SECRET_KEY"} & names
        assert leaked == set(), report
        assert {"PATH", "HOME", "LC_TIME", "PASSED_ON"} <= names, report
    (server,) = (report for report in reports if report["process"] == "server")
    assert "FEDCORE_RUN_SECRET_FD" in server["names"]


def _modes(roots: list[Path]) -> Iterator[tuple[Path, int]]:
    """Each of ``roots`` and everything under it, with its permission bits."""
    for root in roots:
        assert root.exists(), root
        yield root, stat.S_IMODE(root.lstat().st_mode)
        for path in root.rglob("*"):
            if not path.is_symlink() and not path.is_socket():
                yield path, stat.S_IMODE(path.lstat().st_mode)
