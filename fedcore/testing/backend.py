"""The backend conformance suite: what every simulation backend does, run on each.

Subclass :class:`BackendConformance` (every backend) or
:class:`WorkerBackendConformance` (a backend whose ClientApps run in worker
processes: the process pool, Ray's actors) and name the backend::

    class TestProcessBackend(WorkerBackendConformance):
        backend = "process"

A run's ClientApp is :mod:`fedcore.testing.backend_apps`'s, each run on
:data:`WORKERS` workers. Every backend answers a ClientApp past its message's TTL
with code 3 and leaves no worker and no shared-memory segment behind, however the
run ends (a failing ServerApp, cancellation). A worker backend also keeps its
workers warm (each sets up the lifespan once), answers a worker's death with code 8
for the one message it ran and replaces the worker, and reports a failing lifespan as
one :class:`~fedcore.errors.AppLoadError`.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from fedcore.apps import App, Grid, ServerApp
from fedcore.domain import ConfigRecord, Context, ErrorCode, Message, RecordDict
from fedcore.errors import AppLoadError
from fedcore.simulation.simulate import simulate
from fedcore.testing.backend_apps import client
from fedcore.workers.shared_memory import ROOT

WORKERS = 2
"""Workers (processes, actors) each run of the suite asks for."""

Main = Callable[[Grid, Context], Awaitable[Any]]


def app(main: Main) -> App:
    """An app of ``main`` as its ServerApp's main and the suite's ClientApp."""
    server = ServerApp()
    server.main()(main)
    return App(server=server, client=client)


def ask(message_type: str) -> Main:
    """A ServerApp main that sends every node one empty ``message_type`` and returns the replies."""

    async def main(grid: Grid, context: Context) -> list[Message]:
        nodes = await grid.get_node_ids()
        return await grid.send_and_receive([Message(RecordDict(), n, message_type) for n in nodes])

    return main


def pids(replies: list[Message]) -> set[int]:
    """The pids that the replies with content name."""
    return {int(r.content["metrics"]["pid"]) for r in replies if r.has_content()}  # type: ignore[arg-type]


def all_ended(pids: set[int], timeout: float = 30.0) -> bool:
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


def live_children() -> set[int]:
    """Live child processes of this one (zombies excluded)."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:  # threads (and so their task entries) come and go meanwhile
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for pid in children:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
            except (FileNotFoundError, IndexError):
                continue
            if state != "Z":
                found.add(int(pid))
    return found


def segments() -> set[str]:
    """The shared-memory segments of this process's pools."""
    return {path.name for path in ROOT.glob(f"fedcore-{os.getpid()}-*")}


class BackendConformance:
    """What every backend does; set :attr:`backend` to its name.

    :attr:`children`: the backend's workers are this process's children, and the suite
    checks that none outlives a test (the others' workers are checked by their pids).
    """

    backend: ClassVar[str]
    children: ClassVar[bool] = False
    processes: ClassVar[int] = 1
    """The processes a run's ClientApps answer from when each of :data:`WORKERS` nodes
    is asked once: the test process itself, for a backend without workers."""

    @pytest.fixture(autouse=True)
    def _nothing_left_behind(self) -> Iterator[None]:
        before_children, before_segments = live_children(), segments()
        yield
        if self.children:
            assert live_children() <= before_children, "worker processes outlived the run"
        assert segments() <= before_segments, "shared-memory segments were not unlinked"

    async def simulate(self, target: App | Path, **options: Any) -> Any:
        """The value of a seeded simulation of ``target`` on this backend, with
        :data:`WORKERS` workers unless ``options`` say otherwise."""
        options.setdefault("max_workers", WORKERS)
        result = await simulate(target, backend=self.backend, seed=0, progress=False, **options)
        return result.value

    def assert_gone(self, workers: set[int], before: set[str]) -> None:
        """``workers`` (pids) have ended and no segment beyond ``before`` is left."""
        others = workers - {os.getpid()}
        assert all_ended(others), "workers outlived the simulation"
        assert segments() <= before, "shared-memory segments were not unlinked"

    async def test_a_client_app_past_its_ttl_is_stopped_and_answered(self) -> None:
        async def main(grid: Grid, context: Context) -> list[Message]:
            nodes = await grid.get_node_ids()
            return await grid.send_and_receive(
                [Message(RecordDict(), n, "query.hang", ttl=1.0) for n in nodes]
            )

        with anyio.fail_after(30):
            replies = await self.simulate(app(main), nodes=3)
        assert [r.error.code for r in replies if r.has_error()] == [ErrorCode.MESSAGE_UNAVAILABLE]
        assert sum(reply.has_content() for reply in replies) == 2

    async def test_cancelling_the_simulation_leaves_nothing_behind(self) -> None:
        workers: set[int] = set()
        asked = anyio.Event()
        before = segments()

        async def main(grid: Grid, context: Context) -> None:
            workers.update(pids(await ask("query.whoami")(grid, context)))
            asked.set()
            await ask("query.hang")(grid, context)

        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(self.simulate, app(main), nodes=WORKERS))
            await asked.wait()
            group.cancel_scope.cancel()
        assert len(workers) == self.processes
        await anyio.to_thread.run_sync(self.assert_gone, workers, before)

    async def test_a_failing_server_app_leaves_nothing_behind(self) -> None:
        workers: set[int] = set()
        before = segments()

        async def main(grid: Grid, context: Context) -> None:
            workers.update(pids(await ask("query.whoami")(grid, context)))
            raise RuntimeError("the author's bug")

        with pytest.raises(RuntimeError, match="the author's bug"):
            await self.simulate(app(main), nodes=WORKERS)
        assert len(workers) == self.processes
        await anyio.to_thread.run_sync(self.assert_gone, workers, before)


class WorkerBackendConformance(BackendConformance):
    """What a backend whose ClientApps run in worker processes does, beside the rest.

    :attr:`exit_words` and :attr:`kill_words`: what the reason of a message whose
    worker died says, beside that the ClientApp crashed, when the worker ended itself
    and when it was killed from outside; empty where the backend cannot tell.
    """

    exit_words: ClassVar[str] = ""
    kill_words: ClassVar[str] = ""
    processes = WORKERS

    async def test_workers_are_warm_and_set_up_once(self) -> None:
        replies = await self.simulate(app(ask("query.whoami")), nodes=40)
        assert len(pids(replies)) == WORKERS
        assert {reply.content["metrics"]["setups"] for reply in replies} == {1}

    async def test_a_crashed_worker_costs_one_reply_and_is_replaced(self) -> None:
        async def main(grid: Grid, context: Context) -> tuple[list[Message], ...]:
            return await ask("query.crash")(grid, context), await ask("query.whoami")(grid, context)

        crashed, after = await self.simulate(app(main), nodes=6)
        errors = [reply.error for reply in crashed if reply.has_error()]
        assert [error.code for error in errors] == [ErrorCode.CLIENT_APP_CRASHED]
        assert "the ClientApp crashed" in errors[0].reason
        assert self.exit_words in errors[0].reason
        assert sum(reply.has_content() for reply in crashed) == 5
        assert all(reply.has_content() for reply in after)

    async def test_a_worker_killed_mid_round_costs_one_reply_and_is_replaced(self) -> None:
        """SIGKILL from outside (as the OOM killer would) while a worker runs a task.

        The first task is quick and the others take a second: when the quick reply is
        in, the other worker is one task into a second's work, however busy the machine.
        The replacement may take seconds to start, and the survivor answers meanwhile:
        the run asks until both answer, or a deadline passes."""

        async def main(grid: Grid, context: Context) -> tuple[list[Message], ...]:
            nodes = await grid.get_node_ids()
            before = await ask("query.whoami")(grid, context)
            slow = [
                Message(
                    RecordDict({"config": ConfigRecord({"seconds": 1.0 if i else 0.0})}),
                    n,
                    "query.slow",
                )
                for i, n in enumerate(nodes)
            ]
            during: list[Message] = []
            async for reply in grid.receive(await grid.push_messages(slow)):
                if not during:
                    (victim,) = pids(before) - pids([reply])
                    os.kill(victim, signal.SIGKILL)
                during.append(reply)
            after: list[Message] = []
            deadline = time.monotonic() + 60.0
            while len(pids(after)) < WORKERS and time.monotonic() < deadline:
                replies = await ask("query.whoami")(grid, context)
                assert all(reply.has_content() for reply in replies)
                after = replies if len(pids(replies)) > len(pids(after)) else after
            return before, during, after

        before, during, after = await self.simulate(app(main), nodes=4)
        errors = [reply.error for reply in during if reply.has_error()]
        assert len(during) == 4
        assert [error.code for error in errors] == [ErrorCode.CLIENT_APP_CRASHED]
        assert "the ClientApp crashed" in errors[0].reason
        assert self.kill_words in errors[0].reason
        assert all(reply.has_content() for reply in after)
        assert len(pids(after)) == WORKERS, "the dead worker was replaced"
        assert pids(after) != pids(before)

    async def test_a_lifespan_that_fails_is_one_clear_error(self, tmp_path: Path) -> None:
        module = f"failing_lifespan_{self.backend}"
        (tmp_path / f"{module}.py").write_text(
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
            f'[tool.fedcore.app]\nserver = "{module}:server"\nclient = "{module}:client"\n'
        )
        with pytest.raises(AppLoadError, match="lifespan raised OSError: dataset not found"):
            await self.simulate(tmp_path, nodes=2, max_workers=1)


__all__ = ["WORKERS", "BackendConformance", "WorkerBackendConformance", "app", "ask", "pids"]
