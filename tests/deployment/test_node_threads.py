"""A node's ClientApp processes run as many compute threads as their CPU share.

Real processes on loopback: a link, nodes started as an operator would (with
``--num-cpus``, with the default share, with a thread variable of their own), and a
node whose ClientApp processes an exec of its own starts. Each ClientApp process
reports the thread variables it sees; what the operator set in the environment of
the process that starts it (the node, or its exec) stands.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment
from fedcore.workers.sizing import detect_cpus
from fedcore.workers.threads import THREAD_VARIABLES, thread_count

THREADS_APP = Path(__file__).resolve().parent / "threads_app"

pytestmark = pytest.mark.timeout(180)


def _threads(omp: int, mkl: int, openblas: int) -> dict[str, int]:
    return dict(zip(THREAD_VARIABLES, (omp, mkl, openblas), strict=True))


def test_each_node_s_clientapp_process_runs_its_share_of_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with Deployment(tmp_path) as deployment:
        deployment.start_link()
        deployment.start_node("partition-id=0", "--num-cpus", "1.5")
        deployment.start_node("partition-id=1", "--max-concurrent", "2")
        with monkeypatch.context() as operator:
            operator.setenv("OMP_NUM_THREADS", "3")
            deployment.start_node("partition-id=2", "--num-cpus", "1")
        socket_path = tmp_path / "node-exec.sock"
        with monkeypatch.context() as operator:
            operator.setenv("MKL_NUM_THREADS", "5")
            deployment.start_node_exec(socket_path)
        deployment.start_node(
            "partition-id=3", "--num-cpus", "0.5",
            "--exec-socket", str(socket_path),
            "--exec-secret-file", str(deployment.exec_secret_file),
        )  # fmt: skip
        final, reports = deployment.follow_printed(
            deployment.submit(THREADS_APP, **{"min-nodes": 4})
        )
    assert final["status"] == "finished:completed", final
    by_partition = {report.pop("partition"): report for report in reports}
    default_share = thread_count(detect_cpus() / 2)
    assert by_partition == {
        0: _threads(2, 2, 2),  # --num-cpus 1.5, rounded up
        1: _threads(default_share, default_share, default_share),  # its CPUs ÷ --max-concurrent
        2: _threads(3, 1, 1),  # the node's operator set OMP_NUM_THREADS
        3: _threads(1, 5, 1),  # started by an exec whose operator set MKL_NUM_THREADS
    }
