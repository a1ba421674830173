"""``fedcore run`` of a Flower app directory on a real link with two nodes.

The app (``tests/apps/flower_style``) has Flower's tables only and imports ``flwr``
throughout: the link checks its bundle, the nodes find its ClientApp, and the ServerApp
and ClientApp processes import it, each through fedcore's reading of Flower's tables
and its ``flwr`` shim (``flwr`` is not installed here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment, printed_objects

FLOWER_STYLE = Path(__file__).resolve().parents[1] / "apps" / "flower_style"

pytestmark = pytest.mark.timeout(180)


def test_a_flower_app_runs_as_it_is_on_a_link_with_two_nodes(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        done = deployment.fedcore("run", str(FLOWER_STYLE), "--stream", timeout=150)

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"run \d+ finished:completed", done.stderr)
    # FedAvg waits for its two nodes; 2 rounds (the app's config) adding 0.5 each.
    assert printed_objects(done.stdout.splitlines()) == [{"nodes": 2, "weights": [1.0, 1.0, 1.0]}]
    assert "flower-style: final weights [1.0, 1.0, 1.0]" in done.stdout
