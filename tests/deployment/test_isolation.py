"""Isolation below the API, on real processes: what an app process can read of its starters.

A link and two nodes (one starting its ClientApp processes itself, one through an
exec of its own), all started with a control token and an unrelated secret in their
environment and a permissive umask. The app reports the variables each of its
processes started with (``/proc/self/environ``, which any process of the same user
can read): none holds the token, the secret or the run's launch secret, and each
has what an app needs plus what ``--app-env`` passed on. Every app process is
non-dumpable, and each role whose app processes run as its own user said so once.
And every file the link and the nodes wrote is their user's only.

Then, where this process is root and the user ``nobody`` can run a Python with
fedcore: app processes as ``nobody`` (``--app-user`` on the link and on a node, and
a node run as ``nobody`` itself) cannot read the link's database, a node's key kept
by root, nor the memory of the ServerApp or of their starter. A node whose key
permissions are open to others refuses to start.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedcore
from fedcore.testing.deployment import Deployment, Server

ENVIRON_APP = Path(__file__).resolve().parent / "environ_app"
ISOLATION_APP = Path(__file__).resolve().parent / "isolation_app"
SAME_USER = "processes run as this process's user"

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
        assert report["dumpable"] == 0, report
    (server,) = (report for report in reports if report["process"] == "server")
    assert "FEDCORE_RUN_SECRET_FD" in server["names"]
    # The link, the node starting its ClientApps and the node's exec warn, once each;
    # the node whose exec starts them does not.
    warned = {server.name: _log(server).count(SAME_USER) for server in deployment.servers}
    assert warned == {"link": 1, "node0": 1, "exec0": 1, "node1": 0}, warned
    assert "the node's key" in _log(deployment.servers[1])


def test_a_node_refuses_a_key_others_can_read(tmp_path: Path) -> None:
    with Deployment(tmp_path / "deployment") as deployment:
        deployment.start_link()
        key = tmp_path / "open.key"
        deployment.fedcore("keygen", str(tmp_path / "open"))
        key.chmod(0o644)
        with pytest.raises(RuntimeError, match=r"open to others \(mode 0644\).*chmod 600"):
            deployment.start_node("partition-id=0", "--auth-key", str(key))


@pytest.fixture
def nobody_python() -> Iterator[tuple[Path, dict[str, str], Path]]:
    """A Python that ``nobody`` can run with fedcore importable, its environment, and a
    deployment root ``nobody`` may enter and write; skips where there is none."""
    if os.geteuid() != 0:
        pytest.skip("running app processes as another user takes root")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody on this machine")
    repo = str(Path(fedcore.__file__).resolve().parents[1])
    site = sysconfig.get_paths()["purelib"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # This venv's Python, else the system's of the same version on this venv's packages
    # (a venv under /root is out of nobody's reach; extension modules keep one ABI per
    # minor version).
    candidates = [
        (Path(sys.executable), {}),
        (Path(f"/usr/bin/python{version}"), {"PYTHONPATH": f"{site}:{repo}"}),
    ]
    for python, environment in candidates:
        try:
            probe = subprocess.run(
                [str(python), "-c", "import fedcore.cli, numpy"],
                env={**os.environ, **environment},
                user=nobody.pw_uid,
                group=nobody.pw_gid,
                extra_groups=(),
                capture_output=True,
                timeout=60,
                check=False,
            )
        except OSError:  # not there, or not nobody's to run
            continue
        if probe.returncode == 0:
            break
    else:
        pytest.skip("nobody cannot run a Python that imports fedcore here")
    root = Path(tempfile.mkdtemp(prefix="fedcore-isolation-", dir="/tmp"))
    try:
        root.chmod(0o755)
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        yield python, environment, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_app_processes_of_another_user_read_no_key_database_or_memory(
    nobody_python: tuple[Path, dict[str, str], Path],
) -> None:
    python, environment, root = nobody_python
    nobody = pwd.getpwnam("nobody").pw_uid
    with Deployment(root / "deployment", python=python, environment=environment) as deployment:
        deployment.root.chmod(0o755)
        os.chown(deployment.root, nobody, -1)
        deployment.start_link("--app-user", "nobody")
        deployment.start_node("partition-id=0", "--app-user", "nobody")
        deployment.start_node("partition-id=1", user=nobody)  # apps as the node's user
        key0, key1 = (str(deployment.root / node / "node.key") for node in ("node0", "node1"))
        config = {"min-nodes": 2, "database": str(deployment.root / "link.db")}
        run_id = deployment.submit(ISOLATION_APP, **config, keys=f"{key0},{key1}")
        final, reports = deployment.follow_printed(run_id)
        assert final["status"] == "finished:completed", final
        warned = {server.name: _log(server).count(SAME_USER) for server in deployment.servers}
    assert warned == {"link": 0, "node0": 0, "node1": 1}, warned
    by_process: dict[str, list[dict[str, object]]] = {}
    for report in reports:
        by_process.setdefault(str(report.get("process")), []).append(report)
    (server,) = by_process["server"]
    clients = by_process["client"]
    assert len(clients) == 2, reports
    refused = {"mem": "EACCES", "environ": "EACCES"}
    for report in (server, *clients):
        assert report["uid"] == nobody, report
        assert report["dumpable"] == 0, report
        assert report["database"] == "EACCES", report
        assert report["starter"] == refused, report  # the link, or the node
        assert report["keys"][key0] == "EACCES", report  # type: ignore[index]
    for report in clients:  # the ServerApp's memory, though both run as nobody
        assert report["server"] == refused, report
    # node1 runs as nobody, the user of every app process here: they all read its key
    # (what node1 warned about; why an app user must be no role's user), but not
    # node1's memory, nor node0's key, kept by root.
    assert [report["keys"][key1] for report in clients] == ["read", "read"]  # type: ignore[index]


def _log(server: Server) -> str:
    return server.output.read_text(errors="replace")


def _modes(roots: list[Path]) -> Iterator[tuple[Path, int]]:
    """Each of ``roots`` and everything under it, with its permission bits."""
    for root in roots:
        assert root.exists(), root
        yield root, stat.S_IMODE(root.lstat().st_mode)
        for path in root.rglob("*"):
            if not path.is_symlink() and not path.is_socket():
                yield path, stat.S_IMODE(path.lstat().st_mode)
