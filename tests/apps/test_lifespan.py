"""Lifespans run as Flower runs them: teardown after a bare ``yield`` even when the work
raised, and exactly one ``yield``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fedcore.apps.client_app import ClientApp
from fedcore.apps.lifespan import lifespan_context
from fedcore.apps.server_app import ServerApp
from fedcore.domain import Context, Message, RecordDict

CONTEXT = Context(run_id=1, node_id=2)


def test_the_teardown_after_a_bare_yield_runs_when_the_block_raises() -> None:
    trace: list[str] = []

    def lifespan(context: Context) -> Iterator[None]:
        trace.append(f"setup {context.node_id}")
        yield
        trace.append("teardown")

    with pytest.raises(KeyError), lifespan_context(lifespan, CONTEXT):
        raise KeyError("boom")
    assert trace == ["setup 2", "teardown"]


def test_a_lifespan_that_never_yields_is_a_runtime_error() -> None:
    def lifespan() -> Iterator[None]:
        return
        yield

    with pytest.raises(RuntimeError, match="must yield once"), lifespan_context(lifespan):
        raise AssertionError("the block must not run")


def test_a_lifespan_that_yields_twice_is_a_runtime_error_after_its_middle_part() -> None:
    trace: list[str] = []

    def lifespan() -> Iterator[None]:
        yield
        trace.append("middle")
        yield
        trace.append("never")

    with pytest.raises(RuntimeError, match="only once"), lifespan_context(lifespan):
        pass
    assert trace == ["middle"]


def _tracing_lifespan(trace: list[str]) -> Any:
    def lifespan(context: Context) -> Iterator[None]:
        trace.append("setup")
        yield
        trace.append("teardown")

    return lifespan


def test_a_client_apps_lifespan_tears_down_when_the_handler_raises() -> None:
    trace: list[str] = []
    client = ClientApp()
    client.lifespan()(_tracing_lifespan(trace))

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        client(Message(RecordDict(), 2, "train"), CONTEXT)
    assert trace == ["setup", "teardown"]


def test_a_server_apps_lifespan_tears_down_when_main_raises() -> None:
    trace: list[str] = []
    server = ServerApp()
    server.lifespan()(_tracing_lifespan(trace))

    @server.main()
    def main(grid: Any, context: Context) -> None:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        server(None, CONTEXT)
    assert trace == ["setup", "teardown"]
