"""Process-pool workers run as many compute threads as their CPU share, unless the user said.

Real workers report what they see: the thread variables in their environment, the
threads numpy's BLAS runs (threadpoolctl, there with scikit-learn) and torch's
intra-op threads (where torch is installed). The machine is declared with two CPUs
and the pool held to one worker, so that a share of 2 fits and no test starts more
processes than it needs.
"""

from __future__ import annotations

import pytest

import fedcore as fc
from fedcore.workers.threads import THREAD_VARIABLES, thread_count

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _no_thread_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the shell running the tests set, these start from a user who set nothing."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _server(query: str) -> fc.ServerApp:
    server = fc.ServerApp()

    @server.main()
    async def main(grid: fc.Grid, context: fc.Context) -> list[dict[str, int]]:
        nodes = await grid.get_node_ids()
        messages = [fc.Message(fc.RecordDict(), node, f"query.{query}") for node in nodes]
        replies = await grid.send_and_receive(messages)
        assert not any(reply.has_error() for reply in replies), [r.error for r in replies]
        return [dict(reply.content["metrics"]) for reply in replies]  # type: ignore[arg-type]

    return server


async def _report(query: str, num_cpus: float, client: str = "thread_apps") -> list[dict[str, int]]:
    """What each worker of a pool at ``num_cpus`` each reports for ``query``."""
    module = __import__(client)
    result = await fc.simulate(
        fc.App(server=_server(query), client=module.client),
        nodes=2,
        backend="process",
        resources=fc.Resources(num_cpus=num_cpus),
        system=fc.Resources(num_cpus=2),
        max_workers=1,
        seed=0,
    )
    reports: list[dict[str, int]] = result.value
    assert len(reports) == 2
    return reports


def test_a_share_is_rounded_up_in_decimal_and_never_below_one() -> None:
    assert [thread_count(n) for n in (0.01, 0.5, 1, 1.01, 2, 2.5, 0.1 * 3 * 10)] == [
        1, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip


@pytest.mark.parametrize(("num_cpus", "threads"), [(1, 1), (2, 2), (0.5, 1), (1.5, 2)])
async def test_a_worker_s_thread_variables_are_its_cpu_share_rounded_up(
    num_cpus: float, threads: int
) -> None:
    for report in await _report("environment", num_cpus):
        assert report == dict.fromkeys(THREAD_VARIABLES, threads)


async def test_a_thread_variable_the_user_set_is_kept_and_only_that_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for report in await _report("environment", 1):
        assert report == {"OMP_NUM_THREADS": 3, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1}


@pytest.mark.parametrize(("num_cpus", "threads"), [(0.5, 1), (1, 1), (2, 2)])
async def test_numpy_s_blas_runs_the_worker_s_share_of_threads(
    num_cpus: float, threads: int
) -> None:
    pytest.importorskip("threadpoolctl")
    for report in await _report("blas", num_cpus):
        assert report["threads"] == threads


async def test_torch_in_a_worker_runs_its_share_of_intra_op_threads() -> None:
    pytest.importorskip("torch")
    for report in await _report("torch", 1, client="torch_thread_apps"):
        assert report["threads"] == 1
