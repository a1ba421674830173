"""A model far over the frame cap goes ServerApp → link → nodes → ClientApps and back, intact.

The echo app (benchmarks/apps/echo) fails its run when a reply is not the model it
sent, so a completed run is the check that every hop — the runtime API's spooled
bodies, the SQLite blobs, the fleet's chunked payloads, the node's shared-memory
hand-off — kept every byte. How much memory each hop takes is the benchmark's
business (``python -m benchmarks deploy``, cases ``large`` and ``large-memory``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

ECHO = Path(__file__).resolve().parents[2] / "benchmarks" / "apps" / "echo"
MODEL_FLOATS = 6_000_000
"""24 MB: three fleet chunks, and 24 runtime-API spool thresholds."""

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("database", ["file", ":memory:"])
def test_a_model_over_the_frame_cap_echoes_back_intact(tmp_path: Path, database: str) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link(database=None if database == "file" else database)
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        config = f"num-nodes=2 num-server-rounds=2 model-floats={MODEL_FLOATS}"
        done = deployment.fedcore(
            "run", str(ECHO), "--stream", "--run-config", config, timeout=90.0
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert len(re.findall(r"round \d+: [0-9.]+ ms, 2 replies", done.stdout)) == 2
        spool = tmp_path / "link" / "spool"
        assert spool.is_dir(), "the link spools in its work directory"
        assert list(spool.iterdir()) == [], "spooled payloads have no names to leave behind"


BIG_VALUES = Path(__file__).resolve().parent / "big_values_app"


def test_a_config_record_with_3_mib_bytes_and_str_values_echoes_back_intact(
    tmp_path: Path,
) -> None:
    # Over msgpack's 1 MiB header cap each: they travel after the header, through the
    # runtime API, the link's state and fleet, and the node's ClientApp process.
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        for index in range(2):
            deployment.start_node(f"partition-id={index} num-partitions=2")
        done = deployment.fedcore("run", str(BIG_VALUES), "--stream", timeout=90.0)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "echoed 2 rounds" in done.stdout
        assert "Traceback" not in done.stdout + done.stderr


MiB = 1 << 20
CAP = ("--max-value-bytes", str(2 * MiB))


def _run_big_values(deployment: Deployment, **config: int) -> tuple[int, str]:
    """``fedcore run --stream`` of the big-values app with ``config``: its status and output."""
    overrides = " ".join(f"{key}={value}" for key, value in config.items())
    done = deployment.fedcore(
        "run", str(BIG_VALUES), "--stream", "--run-config", overrides, timeout=90.0
    )
    return done.returncode, done.stdout + done.stderr


def test_a_link_and_nodes_given_a_2_mib_cap_carry_1_5_mib_values_and_refuse_3_mib_ones(
    tmp_path: Path,
) -> None:
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        link = deployment.start_link(*CAP)
        nodes = [
            deployment.start_node(f"partition-id={index} num-partitions=2", *CAP)
            for index in range(2)
        ]
        code, output = _run_big_values(deployment, **{"value-bytes": 3 * MiB // 2})
        assert code == 0, output
        assert "echoed 2 rounds" in output

        # The ServerApp, launched by the link with its cap, refuses to push the value.
        code, output = _run_big_values(deployment, **{"value-bytes": 3 * MiB})
        assert code != 0, output
        assert "finished:failed" in output, output
        assert "ValueTooLargeError" in output, output
        assert f"holds {3 * MiB} bytes of bytes in 'blob', over the cap of {2 * MiB}" in output
        assert "--max-value-bytes" in output

        # A ClientApp, started by a node with its cap, may not reply with one either.
        code, output = _run_big_values(
            deployment, **{"value-bytes": MiB, "reply-extra-bytes": 3 * MiB}
        )
        assert code != 0, output
        assert "finished:failed" in output, output
        assert f"holds {3 * MiB} bytes of bytes in 'extra', over the cap of {2 * MiB}" in output

        for server in (link, *nodes):
            assert server.process.poll() is None, server.tail()
        code, output = _run_big_values(deployment, **{"value-bytes": 3 * MiB // 2})
        assert code == 0, output


def test_a_node_with_a_smaller_cap_than_its_link_answers_an_error_at_once(
    tmp_path: Path,
) -> None:
    # The link (and its ServerApp) take 3 MiB; the nodes refuse it as they decode the
    # message, and answer so, rather than dropping it until its TTL.
    with Deployment(tmp_path, heartbeat_interval=1.0) as deployment:
        deployment.start_link()
        nodes = [
            deployment.start_node(f"partition-id={index} num-partitions=2", *CAP)
            for index in range(2)
        ]
        code, output = _run_big_values(deployment, **{"value-bytes": 3 * MiB})
        assert code != 0, output
        assert "finished:failed" in output, output
        assert "the node cannot hold the message's content" in output, output
        assert f"over the cap of {2 * MiB}" in output
        for node in nodes:
            assert node.process.poll() is None, node.tail()
