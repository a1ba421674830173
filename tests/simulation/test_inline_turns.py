"""The inline backend runs a legacy ``ClientApp(client_fn=...)`` on one message at a time
(as one of Flower's actors would), a Message-API app's plain handlers of several nodes
at once; an abandoned legacy handler gives up its turn."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import fedcore as fc
from fedcore.domain import ErrorCode
from fedcore.legacy.client_app import ClientApp as LegacyClientApp
from fedcore.legacy.numpy_client import NumPyClient

pytestmark = pytest.mark.anyio

NODES = 2
SERIAL_WAIT = 0.5
"""Seconds a handler of the legacy app waits for the other node's handler to join it:
on main they were started together, so one that runs at once arrives well within it."""
HANG = 60.0
"""Seconds the abandoned handler hangs unless released: past the next message's TTL."""
CONCURRENT_WAIT = 30.0
"""Seconds a Message-API handler waits for the other (it returns as soon as it comes)."""


class Overlap:
    """Counts the handlers inside at once; the first waits a while for a second."""

    def __init__(self, wait: float) -> None:
        self._wait = wait
        self._lock = threading.Lock()
        self._inside = 0
        self._together = threading.Event()
        self.most = 0

    @contextmanager
    def inside(self) -> Iterator[None]:
        with self._lock:
            self._inside += 1
            self.most = max(self.most, self._inside)
            if self._inside == NODES:
                self._together.set()
        try:
            self._together.wait(self._wait)
            yield
        finally:
            with self._lock:
                self._inside -= 1


def _train_all(grid: fc.SyncGrid, context: fc.Context) -> list[fc.Message]:
    content = fc.RecordDict({"arrays": fc.ArrayRecord({"w": np.zeros(2, np.float32)})})
    nodes = grid.get_node_ids()
    return grid.send_and_receive([fc.Message(content, node, "train") for node in nodes])


def _app(client: fc.ClientApp, main: Any = _train_all) -> fc.App:
    server = fc.ServerApp()
    server.main()(main)
    return fc.App(server=server, client=client)


def _legacy_app(fit: Any) -> LegacyClientApp:
    class Client(NumPyClient):
        def fit(self, parameters: Any, config: Any) -> Any:
            return fit(parameters, config), 1, {}

    return LegacyClientApp(client_fn=lambda context: Client().to_client())


async def test_a_legacy_client_fn_app_serves_one_message_at_a_time() -> None:
    overlap = Overlap(SERIAL_WAIT)

    def fit(parameters: Any, config: Any) -> Any:
        with overlap.inside():
            return parameters

    result = await fc.simulate(_app(_legacy_app(fit)), nodes=NODES, seed=0, backend="inline")
    assert [reply.has_content() for reply in result.value] == [True] * NODES
    assert overlap.most == 1


async def test_a_message_api_app_s_plain_handlers_still_run_at_once() -> None:
    overlap = Overlap(CONCURRENT_WAIT)
    client = fc.ClientApp()

    @client.train()
    def train(msg: fc.Message, context: fc.Context) -> fc.Message:
        with overlap.inside():
            return fc.Message(fc.RecordDict(), reply_to=msg)

    result = await fc.simulate(_app(client), nodes=NODES, seed=0, backend="inline")
    assert [reply.has_content() for reply in result.value] == [True] * NODES
    assert overlap.most == NODES


async def test_an_abandoned_legacy_handler_does_not_hold_the_next_message() -> None:
    """The first node's fit hangs past its TTL; the second's, sent after, is answered
    while the first still hangs."""
    release = threading.Event()

    def fit(parameters: Any, config: Any) -> Any:
        if config.get("hang"):
            release.wait(HANG)
        return parameters

    def main(grid: fc.SyncGrid, context: fc.Context) -> list[fc.Message]:
        first, second = grid.get_node_ids()
        arrays = fc.ArrayRecord({"w": np.zeros(2, np.float32)})
        hang = fc.RecordDict({"arrays": arrays, "config": fc.ConfigRecord({"hang": True})})
        replies = grid.send_and_receive([fc.Message(hang, first, "train", ttl=0.5)])
        replies += grid.send_and_receive(
            [fc.Message(fc.RecordDict({"arrays": arrays}), second, "train", ttl=10)]
        )
        release.set()
        return replies

    result = await fc.simulate(_app(_legacy_app(fit), main), nodes=NODES, seed=0, backend="inline")
    abandoned, answered = result.value
    assert abandoned.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert answered.has_content()
