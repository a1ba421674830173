"""A Ray actor of the ``ray`` backend: import the ClientApp once, then run its tasks in order.

This module runs on the cluster's nodes, in the actor's own worker process: Ray
imports it there by name when the backend creates an actor, so every node needs
fedcore installed (``pip install 'fedcore[ray]'``) — the app itself travels with the
run (:mod:`.ray`). The actor's environment was set before Python started (the
backend's ``runtime_env``: thread caps, ``FEDCORE_WORKER``); fedcore's secrets are
taken out of it before any of the app's code runs, as a process worker never has them.

An actor is created with the ClientApp's reference, imports it (with the engine's
``sys.path`` behind its own search path) and enters its lifespan once, in
``__init__``. A failure there is kept and reported by :meth:`ClientActor.hello`, the
first call the backend makes, so that a ClientApp that fails to import ends the run
with its one-line reason rather than as a dead actor. Then each :meth:`run` is one task
of the worker protocol (:mod:`fedcore.wire.worker`): the task's bytes and, for a large
content, the round's content from the object store — Ray hands that argument over as
a read-only numpy view of the store's shared memory, so its arrays reach the handler
without a copy. The outcome goes back as one ``uint8`` array of msgpack frames, which
Ray stores and returns without pickling anything of the app's.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import ray

from fedcore.apps.client_app import ClientApp
from fedcore.apps.environment import without_secrets
from fedcore.clock import SystemClock
from fedcore.domain import RecordDict
from fedcore.errors import DecodeError
from fedcore.simulation.backends.worker import (
    adopt_sys_path,
    load_client,
    load_failure,
    run_task,
)
from fedcore.wire import unpack_recorddict
from fedcore.wire.worker import unpack_task

STORED = "object-store"
"""The segment name a task gives when its content is the object passed along with it."""

Bytes = np.ndarray
"""A ``uint8`` array of wire bytes: how payloads cross Ray without pickling."""


class ClientActor:
    """One ClientApp, warm, on one Ray node; tasks run one at a time, in the order sent."""

    def __init__(
        self, client_ref: str, search_path: str, sys_path: list[str], main_file: str
    ) -> None:
        for name in set(os.environ) - set(without_secrets(os.environ)):
            del os.environ[name]
        # A run whose app directory Ray shipped starts here, in the node's copy of it.
        search = Path(search_path) if search_path else Path.cwd()
        adopt_sys_path([str(search), *(p for p in sys_path if os.path.isdir(p))])
        self._client: ClientApp | None = None
        self._failure = ""
        self._loop = asyncio.new_event_loop()
        self._clock = SystemClock()
        try:
            client = load_client(client_ref, search, main_file)
            self._lifespan = client.started()
            self._lifespan.__enter__()
        except Exception as exc:
            self._failure = load_failure(exc)
        else:
            self._client = client

    def hello(self) -> tuple[str, str, int]:
        """This actor's node id, why its ClientApp failed to load (``""`` if it did not),
        and its pid."""
        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id, self._failure, os.getpid()

    def run(self, task: bytes, content: Bytes | None) -> Bytes:
        """Run one task; return its outcome's frames."""
        assert self._client is not None, "the backend runs no task on an actor that failed"

        def stored(name: str) -> RecordDict:
            if name != STORED or content is None:
                raise DecodeError(f"a task names segment {name!r}; an actor reads none")
            return unpack_recorddict(content.data)

        message, context = unpack_task(task, stored)
        parts = run_task(self._client, message, context, self._loop.run_until_complete, self._clock)
        return np.frombuffer(b"".join(parts), dtype=np.uint8)

    def stop(self) -> None:
        """Run the lifespan's teardown; the backend then ends the actor."""
        if self._client is not None:
            self._client = None
            self._lifespan.__exit__(None, None, None)
        self._loop.close()
