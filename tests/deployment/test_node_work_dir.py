"""One node process per work directory, on real processes: a second node on a held
directory exits at once, naming it and ``--work-dir``, while the first serves on; a
SIGKILLed node's directory takes a new node at once (the OS dropped its lock).

Without the lock, nodes sharing a directory share its key: the link takes them for
one node, each new session ends the other's, and a run waits for ever.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from fedcore.testing.deployment import FEDCORE, Deployment

pytestmark = pytest.mark.timeout(120)


def listed_nodes(deployment: Deployment) -> list[dict[str, object]]:
    listed = deployment.fedcore("ls", "--nodes", "--json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    nodes: list[dict[str, object]] = json.loads(listed.stdout)
    return nodes


def test_a_second_node_on_a_held_work_dir_exits_at_once_saying_so(tmp_path: Path) -> None:
    shared = tmp_path / "shared-node"
    with Deployment(tmp_path) as deployment:
        deployment.start_link(database=":memory:")
        assert deployment.link is not None
        first = deployment.start_node("partition-id=0", "--work-dir", str(shared))
        before = listed_nodes(deployment)
        assert len(before) == 1, before
        started = time.monotonic()
        second = subprocess.run(
            [str(FEDCORE), "serve", "--role", "node",
             "--link", deployment.link.address("fleet"),
             "--node-config", "partition-id=1",
             "--work-dir", str(shared)],
            capture_output=True, text=True, timeout=30, cwd=tmp_path, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
        assert second.returncode != 0, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert str(shared.resolve()) in lines[0], lines[0]
        assert "--work-dir" in lines[0], lines[0]
        assert f"pid {first.process.pid}" in lines[0], lines[0]
        assert took < 15, f"the second node took {took:.1f} s to give up"
        # The first node never saw the second: it serves on, the link's one node.
        assert first.process.poll() is None, first.tail()
        assert listed_nodes(deployment) == before
        assert "no such session" not in deployment.link.tail(400)


def test_a_sigkilled_node_s_work_dir_takes_a_new_node_at_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared-node"
    with Deployment(tmp_path) as deployment:
        deployment.start_link(database=":memory:")
        first = deployment.start_node("partition-id=0", "--work-dir", str(shared))
        deployment.kill(first)
        again = deployment.start_node("partition-id=0", "--work-dir", str(shared))
        assert again.process.poll() is None, again.tail()
        assert "serving the link" in again.tail(200), again.tail()
