"""The ray backend's own contract, on the session's shared Ray (fedcore.testing.backends).

What every backend does is the conformance suite's (:mod:`fedcore.testing.backend`,
run in test_backend_conformance.py; test_simulate.py and the other tests run over
``backend_params()``); here is what Ray's actors add: batches of tasks in one call
whose failures cost only the reply of the task that failed, GPU fractions sharing a
device, thread caps, a round's model put into the object store once, and W3 ending
bit for bit where the other backends end. The shared Ray has 2 CPUs and one (logical)
GPU, so a run at one CPU each has two actors.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pool_apps import client
from w3_models import same_bits, w3_model

import fedcore as fc
from fedcore.domain import ErrorCode
from fedcore.errors import UsageError
from fedcore.simulation.backends import BACKENDS
from fedcore.workers.threads import THREAD_VARIABLES

pytestmark = [pytest.mark.anyio, pytest.mark.ray]

pytest.importorskip("ray", reason="Ray is not installed: pip install 'fedcore[ray]'")
ray_backend = importlib.import_module("fedcore.simulation.backends.ray")


def _app(main: Any, app_client: fc.ClientApp = client) -> fc.App:
    server = fc.ServerApp()
    server.main()(main)
    return fc.App(server=server, client=app_client)


def _ask(message_type: str) -> Any:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        nodes = await grid.get_node_ids()
        return await grid.send_and_receive(
            [fc.Message(fc.RecordDict(), n, message_type) for n in nodes]
        )

    return main


async def ray_run(app: fc.App | Path, **options: Any) -> Any:
    return (await fc.simulate(app, backend="ray", seed=0, progress=False, **options)).value


BATCHED_NODES = 60
ASKED = 30
"""Of a round of quick tasks on 60 nodes, the one asked something else, by position: by
then each actor's batches have grown past one task."""


def _asked(config: dict[str, Any]) -> Any:
    """A round of ``query.asked`` where message :data:`ASKED` carries ``config``;
    ``main`` returns that message's node and the replies."""

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[int, list[fc.Message]]:
        nodes = await grid.get_node_ids()
        messages = [
            fc.Message(
                fc.RecordDict({"config": fc.ConfigRecord(config if i == ASKED else {})}),
                n,
                "query.asked",
            )
            for i, n in enumerate(nodes)
        ]
        return nodes[ASKED], await grid.send_and_receive(messages)

    return main


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The node of each job of each actor call the backend makes, as it makes them."""
    calls: list[list[int]] = []
    send = ray_backend.RayBackend._send

    async def recorded(self: Any, actor: Any, in_flight: Any, jobs: list[Any]) -> None:
        calls.append([job.message.metadata.dst_node_id for job in jobs])
        await send(self, actor, in_flight, jobs)

    monkeypatch.setattr(ray_backend.RayBackend, "_send", recorded)
    return calls


def _errors(replies: list[fc.Message]) -> dict[int, ErrorCode]:
    return {r.metadata.src_node_id: ErrorCode(r.error.code) for r in replies if r.has_error()}


async def test_a_client_app_that_raises_in_a_batch_costs_its_own_reply_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _calls(monkeypatch)
    node, replies = await ray_run(_app(_asked({"fail": True})), nodes=BATCHED_NODES)
    assert len(replies) == BATCHED_NODES
    assert _errors(replies) == {node: ErrorCode.CLIENT_APP_RAISED_EXCEPTION}
    assert [len(call) > 1 for call in calls if node in call] == [True], "once, in a batch"


async def test_an_actor_that_dies_in_a_batch_costs_the_reply_of_the_job_that_killed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's jobs run again one per call: the one that ends its process again is
    the one answered with code 8, and no other job of the batch is."""
    calls = _calls(monkeypatch)
    node, replies = await ray_run(_app(_asked({"exit": True})), nodes=BATCHED_NODES)
    assert len(replies) == BATCHED_NODES
    assert _errors(replies) == {node: ErrorCode.CLIENT_APP_CRASHED}
    with_it = [call for call in calls if node in call]
    assert len(with_it[0]) > 1, "it first ran in a batch"
    assert with_it[1:] == [[node]], "then alone, once"


async def test_an_actor_killed_from_outside_during_a_batch_costs_no_reply(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGKILL mid-batch, once: every job of the lost batch runs again, alone, and succeeds."""
    calls = _calls(monkeypatch)
    marker = tmp_path / "killed"
    node, replies = await ray_run(_app(_asked({"kill-once": str(marker)})), nodes=BATCHED_NODES)
    assert marker.exists(), "the actor was killed"
    assert len(replies) == BATCHED_NODES
    assert _errors(replies) == {}
    (lost,) = [call for call in calls if node in call and len(call) > 1]
    assert all(calls.count([n]) == 1 for n in lost), "each job of the lost batch, alone once"


async def test_the_thread_variables_reach_the_actor_s_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set before numpy loads, not only in the environment: numpy's BLAS, loaded by the
    ClientApp, runs the threads ``OPENBLAS_NUM_THREADS`` says (set here to 2, which
    fedcore passes on; Ray's own default for a 1-CPU actor is one thread)."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    from thread_apps import client as thread_client

    reports = await ray_run(_app(_ask("query.blas"), thread_client), nodes=2)
    assert [r.content["metrics"]["threads"] for r in reports] == [2, 2]


async def test_fractional_gpus_share_a_device() -> None:
    """Half a GPU each: two actors on the shared Ray's one GPU, both shown device 0."""
    replies = await ray_run(
        _app(_ask("query.whoami")), nodes=8, resources=fc.Resources(num_cpus=0.5, num_gpus=0.5)
    )
    by_pid: dict[int, set[int]] = {}
    for reply in replies:
        metrics = reply.content["metrics"]
        by_pid.setdefault(int(metrics["pid"]), set()).add(int(metrics["device"]))  # type: ignore[call-overload]
    assert sorted(by_pid.values()) == [{0}, {0}]


@pytest.mark.parametrize(("num_cpus", "threads"), [(2, 2), (0.5, 1)])
async def test_an_actor_s_thread_variables_are_its_cpu_share(
    monkeypatch: pytest.MonkeyPatch, num_cpus: float, threads: int
) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    from thread_apps import client as thread_client

    reports = await ray_run(
        _app(_ask("query.environment"), thread_client),
        nodes=2,
        resources=fc.Resources(num_cpus=num_cpus),
        max_workers=1,
    )
    assert [dict(r.content["metrics"]) for r in reports] == [
        dict.fromkeys(THREAD_VARIABLES, threads)
    ] * 2


async def test_a_thread_variable_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    from thread_apps import client as thread_client

    reports = await ray_run(_app(_ask("query.environment"), thread_client), nodes=1, max_workers=1)
    (report,) = [dict(r.content["metrics"]) for r in reports]
    assert report == {"OMP_NUM_THREADS": 3, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1}


async def test_a_round_s_model_goes_into_the_object_store_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    puts = []
    put = ray_backend._put

    def counted(content: fc.RecordDict) -> Any:
        puts.append(id(content))
        return put(content)

    monkeypatch.setattr(ray_backend, "_put", counted)
    size = 2**16  # 256 KiB of float32: over the store threshold

    async def main(grid: fc.Grid, context: fc.Context) -> list[float]:
        nodes = await grid.get_node_ids()
        totals = []
        for round_number in range(3):
            w = np.full(size, round_number + 1, np.float32)
            model = fc.RecordDict({"arrays": fc.ArrayRecord({"w": w})})
            replies = await grid.send_and_receive([fc.Message(model, n, "train") for n in nodes])
            totals += [float(reply.content["arrays"]["w"].sum()) for reply in replies]
        return totals

    totals = await ray_run(_app(main), nodes=10)
    assert totals == [float(size * r) for r in (1, 2, 3) for _ in range(10)]
    assert len(puts) == 3, "one put per round's model, not one per message"


async def test_a_request_no_node_can_meet_is_refused_at_once() -> None:
    with pytest.raises(UsageError, match="no node of the Ray cluster has that many"):
        await ray_run(_app(_ask("query.whoami")), nodes=1, resources=fc.Resources(num_cpus=3))


def test_w3_ends_with_the_same_model_bit_for_bit_on_every_backend() -> None:
    models = {backend: w3_model(backend) for backend in BACKENDS}
    assert same_bits(models["ray"], models["process"])
    assert same_bits(models["ray"], models["inline"])
