"""The ray backend's own contract, on the session's shared Ray (fedcore.testing.backends).

What every backend does is the conformance suite's (test_simulate.py and the other
tests run over ``backend_params()``); here is what an actor backend adds: warm actors
set up once, an actor that dies costing exactly the reply it was running, TTLs,
actors gone after a run however it ended, GPU fractions sharing a device, thread caps,
a round's model put into the object store once, and W3 ending bit for bit where the
other backends end. The shared Ray has 2 CPUs and one (logical) GPU, so a run at one
CPU each has two actors.
"""

from __future__ import annotations

import functools
import importlib
import os
import select
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from pool_apps import client
from w3_models import same_bits, w3_model

import fedcore as fc
from fedcore.domain import ErrorCode
from fedcore.errors import AppLoadError, UsageError
from fedcore.simulation.backends import BACKENDS
from fedcore.testing.backends import SHARED_CPUS
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


def _pids(replies: list[fc.Message]) -> set[int]:
    return {int(reply.content["metrics"]["pid"]) for reply in replies if reply.has_content()}  # type: ignore[call-overload]


def _all_ended(pids: set[int], timeout: float = 30.0) -> bool:
    """Whether every process of ``pids`` ends within ``timeout`` seconds (watched by pidfd)."""
    remaining = []
    for pid in pids:
        try:
            remaining.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    descriptors = list(remaining)
    deadline = time.monotonic() + timeout
    try:
        while remaining:
            readable, _, _ = select.select(remaining, [], [], max(deadline - time.monotonic(), 0))
            if not readable:
                return False
            remaining = [d for d in remaining if d not in readable]
        return True
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


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

    def recorded(self: Any, actor: Any, in_flight: Any, jobs: list[Any]) -> None:
        calls.append([job.message.metadata.dst_node_id for job in jobs])
        send(self, actor, in_flight, jobs)

    monkeypatch.setattr(ray_backend.RayBackend, "_send", recorded)
    return calls


def _errors(replies: list[fc.Message]) -> dict[int, ErrorCode]:
    return {r.metadata.src_node_id: ErrorCode(r.error.code) for r in replies if r.has_error()}


async def test_actors_are_warm_and_set_up_once() -> None:
    replies = await ray_run(_app(_ask("query.whoami")), nodes=20)
    assert len(_pids(replies)) == SHARED_CPUS
    assert {reply.content["metrics"]["setups"] for reply in replies} == {1}


async def test_an_actor_killed_mid_round_costs_one_reply_and_the_run_goes_on() -> None:
    """SIGKILL from outside (as the OOM killer would) while an actor runs a task.

    The first task is quick and the others take a second: when the quick reply is in,
    the other actor is one task into a second's work, however busy the machine."""

    async def main(grid: fc.Grid, context: fc.Context) -> tuple[list[fc.Message], ...]:
        nodes = await grid.get_node_ids()
        before = await grid.send_and_receive(
            [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        )
        actors = _pids(before)
        slow = [
            fc.Message(fc.RecordDict({"config": fc.ConfigRecord({"seconds": 1.0 if i else 0.0})}),
                       n, "query.slow")
            for i, n in enumerate(nodes)
        ]  # fmt: skip
        during = []
        async for reply in grid.receive(await grid.push_messages(slow)):
            if not during:
                (victim,) = actors - _pids([reply])
                os.kill(victim, signal.SIGKILL)
            during.append(reply)
        # The replacement takes a Ray worker's start-up (seconds on a busy machine), and
        # the survivor answers meanwhile: ask until both answer, or the deadline passes.
        after: list[fc.Message] = []
        deadline = time.monotonic() + 60.0
        while len(_pids(after)) < SHARED_CPUS and time.monotonic() < deadline:
            replies = await grid.send_and_receive(
                [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
            )
            assert all(reply.has_content() for reply in replies)
            after = replies if len(_pids(replies)) > len(_pids(after)) else after
        return before, during, after

    before, during, after = await ray_run(_app(main), nodes=4)
    errors = [reply.error for reply in during if reply.has_error()]
    assert len(during) == 4
    assert [error.code for error in errors] == [ErrorCode.CLIENT_APP_CRASHED]
    assert "the ClientApp crashed" in errors[0].reason
    assert all(reply.has_content() for reply in after)
    assert len(_pids(after)) == SHARED_CPUS, "the dead actor was replaced"
    assert _pids(after) != _pids(before)


async def test_a_client_app_that_ends_its_process_costs_one_reply() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> tuple[list[fc.Message], list[fc.Message]]:
        nodes = await grid.get_node_ids()
        crashed = await grid.send_and_receive(
            [fc.Message(fc.RecordDict(), n, "query.crash") for n in nodes]
        )
        after = await grid.send_and_receive(
            [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
        )
        return crashed, after

    crashed, after = await ray_run(_app(main), nodes=6)
    assert [r.error.code for r in crashed if r.has_error()] == [ErrorCode.CLIENT_APP_CRASHED]
    assert sum(reply.has_content() for reply in crashed) == 5
    assert all(reply.has_content() for reply in after)


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


async def test_a_client_app_past_its_ttl_is_stopped_and_answered() -> None:
    async def main(grid: fc.Grid, context: fc.Context) -> list[fc.Message]:
        nodes = await grid.get_node_ids()
        return await grid.send_and_receive(
            [fc.Message(fc.RecordDict(), n, "query.hang", ttl=1.0) for n in nodes]
        )

    with anyio.fail_after(30):
        replies = await ray_run(_app(main), nodes=3)
    assert [r.error.code for r in replies if r.has_error()] == [ErrorCode.MESSAGE_UNAVAILABLE]
    assert sum(reply.has_content() for reply in replies) == 2


async def test_cancelling_the_simulation_leaves_no_actor_behind() -> None:
    actors: set[int] = set()
    asked = anyio.Event()

    async def main(grid: fc.Grid, context: fc.Context) -> None:
        nodes = await grid.get_node_ids()
        actors.update(
            _pids(
                await grid.send_and_receive(
                    [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
                )
            )
        )
        asked.set()
        await grid.send_and_receive([fc.Message(fc.RecordDict(), n, "query.hang") for n in nodes])

    async with anyio.create_task_group() as group:
        group.start_soon(functools.partial(ray_run, _app(main), nodes=2))
        await asked.wait()
        group.cancel_scope.cancel()
    assert len(actors) == SHARED_CPUS
    assert await anyio.to_thread.run_sync(_all_ended, actors)


async def test_a_failing_server_app_leaves_no_actor_behind() -> None:
    actors: set[int] = set()

    async def main(grid: fc.Grid, context: fc.Context) -> None:
        nodes = await grid.get_node_ids()
        actors.update(
            _pids(
                await grid.send_and_receive(
                    [fc.Message(fc.RecordDict(), n, "query.whoami") for n in nodes]
                )
            )
        )
        raise RuntimeError("the author's bug")

    with pytest.raises(RuntimeError, match="the author's bug"):
        await ray_run(_app(main), nodes=2)
    assert len(actors) == SHARED_CPUS
    assert await anyio.to_thread.run_sync(_all_ended, actors)


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


async def test_a_lifespan_that_fails_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "ray_failing_lifespan_mod.py").write_text(
        textwrap.dedent(
            """\
            import fedcore as fc
            client = fc.ClientApp()
            server = fc.ServerApp()

            @client.lifespan()
            def lifespan():
                raise OSError("dataset not found")
                yield
            """
        )
    )
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fedcore.app]\nserver = "ray_failing_lifespan_mod:server"\n'
        'client = "ray_failing_lifespan_mod:client"\n'
    )
    with pytest.raises(AppLoadError, match="lifespan raised OSError: dataset not found"):
        await ray_run(tmp_path, nodes=2, max_workers=1)


async def test_a_request_no_node_can_meet_is_refused_at_once() -> None:
    with pytest.raises(UsageError, match="no node of the Ray cluster has that many"):
        await ray_run(_app(_ask("query.whoami")), nodes=1, resources=fc.Resources(num_cpus=3))


def test_w3_ends_with_the_same_model_bit_for_bit_on_every_backend() -> None:
    models = {backend: w3_model(backend) for backend in BACKENDS}
    assert same_bits(models["ray"], models["process"])
    assert same_bits(models["ray"], models["inline"])
