"""What a Ray actor of the ``ray`` backend runs: its ClientApp, loaded once, and batches of tasks.

:class:`.ray_actor.ClientActor` makes an :class:`ActorClient` once its environment is
set. It takes fedcore's secrets out of the environment before any of the app's code
runs, as a process worker never has them, imports the ClientApp (with the engine's
``sys.path`` behind its own search path) and enters its lifespan. A failure there is
kept and reported by :meth:`ActorClient.hello`, the first call the backend makes, so
that a ClientApp that fails to import ends the run with its one-line reason rather
than as a dead actor.

Then each :meth:`ActorClient.run` is a batch: tasks of the worker protocol
(:mod:`fedcore.wire.worker`), run one after another, and, for those whose content is
large, that content from the object store — Ray hands such an argument over as a
read-only numpy view of the store's shared memory, so its arrays reach the handler
without a copy. A batch stops early, once it has run for :data:`BATCH_SECONDS` or its
outcomes have reached :data:`BATCH_BYTES`: a slow task then holds back no reply of
the batch for longer than it takes itself, nor does a batch of large replies pile up
here; the backend sends the tasks not run again. The outcomes go back as one
``uint8`` array (:func:`~fedcore.wire.worker.pack_outcomes`), which Ray stores and
returns without pickling anything of the app's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import ray

from fedcore.apps.client_app import ClientApp
from fedcore.apps.environment import without_secrets
from fedcore.clock import SystemClock
from fedcore.domain import RecordDict
from fedcore.errors import DecodeError
from fedcore.wire import DecodeLimits, Parts, parts_size, unpack_recorddict
from fedcore.wire.worker import pack_outcomes, unpack_task
from fedcore.workers.worker import (
    adopt_sys_path,
    load_client,
    load_failure,
    run_task,
)

STORED = "object-store"
"""The segment name a task gives when its content is one of the objects passed along."""
BATCH_SECONDS = 0.05
"""Seconds of running after which a batch returns what it has, leaving the rest unrun."""
BATCH_BYTES = 8 * 1024 * 1024
"""Bytes of outcomes at which a batch returns what it has, leaving the rest unrun."""

Bytes = np.ndarray
"""A ``uint8`` array of wire bytes: how payloads cross Ray without pickling."""


class ActorClient:
    """The ClientApp of one actor and what runs it: an event loop, a clock."""

    def __init__(
        self,
        client_ref: str,
        search_path: str,
        sys_path: list[str],
        main_file: str,
        max_value_len: int,
    ):
        for name in set(os.environ) - set(without_secrets(os.environ)):
            del os.environ[name]
        # A run whose app directory Ray shipped starts here, in the node's copy of it.
        search = Path(search_path) if search_path else Path.cwd()
        adopt_sys_path([str(search), *(p for p in sys_path if os.path.isdir(p))])
        self._client: ClientApp | None = None
        self._failure = ""
        self._limits = DecodeLimits(max_value_len=max_value_len)
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
        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id, self._failure, os.getpid()

    def run(self, tasks: list[bytes], places: list[int], contents: Sequence[Bytes]) -> Bytes:
        """Run ``tasks`` in order, until the batch's time or bytes run out; return the
        outcomes of those that ran. ``places[i]`` is the position in ``contents`` of
        task ``i``'s content, or -1 for a task that carries its own."""
        client = self._client
        assert client is not None, "the backend runs no task on an actor that failed"
        started = self._clock.now()
        outcomes: list[Parts] = []
        size = 0
        for task, place in zip(tasks, places, strict=True):

            def stored(name: str, place: int = place) -> RecordDict:
                if name != STORED or place < 0:
                    raise DecodeError(f"a task names segment {name!r}; an actor reads none")
                return unpack_recorddict(contents[place].data, self._limits)

            message, context = unpack_task(task, stored, self._limits)
            parts = run_task(
                client, message, context, self._loop.run_until_complete, self._clock, self._limits
            )
            outcomes.append(parts)
            size += parts_size(parts)
            if self._clock.now() - started >= BATCH_SECONDS or size >= BATCH_BYTES:
                break
        packed = pack_outcomes(outcomes, self._clock.now() - started)
        return np.frombuffer(b"".join(packed), dtype=np.uint8)

    def stop(self) -> None:
        """Run the lifespan's teardown."""
        if self._client is not None:
            self._client = None
            self._lifespan.__exit__(None, None, None)
        self._loop.close()
