"""``fedcore run`` of a legacy Flower app directory on a real link with two nodes.

The app (``tests/apps/legacy_style``): ``ServerApp(server_fn=...)`` with the legacy
``FedAvg`` and ``ServerConfig(num_rounds=3)``, and a ``NumPyClient`` in
``ClientApp(client_fn=...)``. The legacy ``Server`` in the ServerApp process calls the
nodes through ``GridClientProxy`` objects, each call a Message through the link.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

LEGACY_STYLE = Path(__file__).resolve().parents[1] / "apps" / "legacy_style"

pytestmark = pytest.mark.timeout(180)


def test_a_legacy_app_runs_unchanged_on_a_link_with_two_nodes(tmp_path: Path) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        done = deployment.fedcore(
            "run", str(LEGACY_STYLE), "--run-config", "min-clients=2", "--stream", timeout=150
        )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"run \d+ finished:completed", done.stderr)
    # The legacy server waited for both nodes and ran 3 rounds on them.
    assert output.count("configure_fit: strategy sampled 2 clients (out of 2)") == 3
    assert output.count("aggregate_evaluate: received 2 results and 0 failures") == 3
    summary = output[output.index("[SUMMARY]") :]
    assert "History (loss, distributed):" in summary
    for server_round, loss in ((1, 3.0), (2, 6.0), (3, 9.0)):
        assert f"round {server_round}: {loss}" in summary
