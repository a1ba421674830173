"""A Ray actor of the ``ray`` backend: its environment first, then the ClientApp.

This module runs on the cluster's nodes, in the actor's own worker process: Ray
imports it there by name when the backend creates an actor, so every node needs
fedcore installed (``pip install 'fedcore[ray]'``) — the app itself travels with the
run (:mod:`.ray`).

The environment comes first. The backend hands each actor its variables — the thread
caps of :mod:`fedcore.workers.threads`, ``FEDCORE_WORKER`` — as arguments, and
``__init__`` sets them before anything in the process has loaded numpy, torch or a BLAS,
which read their caps once, as they load: Ray's worker loads none of them, and neither
does this module nor the packages above it, so the caps hold for the ClientApp's
imports, which come after (``test_the_thread_variables_reach_the_actor_s_blas`` checks).
Ray's ``runtime_env`` would set them before Python starts, but an actor with a
``runtime_env`` of its own needs a worker process started for it through Ray's
runtime-env agent, where one without takes a worker Ray started in advance, several
times quicker. Only then does ``__init__`` import :mod:`.ray_tasks`, which loads the
ClientApp and runs the tasks.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedcore.simulation.backends.ray_tasks import ActorClient, Bytes


class ClientActor:
    """One ClientApp, warm, on one Ray node; batches of tasks run in the order sent."""

    def __init__(
        self,
        environment: dict[str, str],
        client_ref: str,
        search_path: str,
        sys_path: list[str],
        main_file: str,
        max_value_len: int,
    ) -> None:
        os.environ.update(environment)
        # Imported here, after the environment: it loads numpy (see the module docstring).
        from fedcore.simulation.backends.ray_tasks import ActorClient

        self._client: ActorClient = ActorClient(
            client_ref, search_path, sys_path, main_file, max_value_len
        )

    def hello(self) -> tuple[str, str, int]:
        """This actor's node id, why its ClientApp failed to load (``""`` if it did not),
        and its pid."""
        return self._client.hello()

    def run(self, tasks: list[bytes], places: list[int], *contents: Any) -> Bytes:
        """Run a batch of tasks (see :meth:`.ray_tasks.ActorClient.run`)."""
        return self._client.run(tasks, places, contents)

    def stop(self) -> None:
        """Run the lifespan's teardown; the backend then ends the actor."""
        self._client.stop()
