"""The legacy ``ServerApp(server_fn=...)``: Flower's ``flwr.server.ServerApp``, legacy forms too.

A fedcore :class:`~fedcore.apps.server_app.ServerApp` that also takes Flower's
legacy arguments. Given ``server_fn`` (or, deprecated, ``server``/``config``/
``strategy``/``client_manager``), or nothing and no ``@app.main()``, its main is
Flower's compatibility mode: ``server_fn(context)`` gives the
:class:`~fedcore.legacy.server_config.ServerAppComponents`, the Grid's nodes are
registered as :class:`~fedcore.legacy.grid_client_proxy.GridClientProxy` clients
(and kept so while nodes come and go), and the legacy ``Server`` runs
``config.num_rounds`` rounds. That main is a plain ``def``: it runs in a worker
thread on a :class:`~fedcore.apps.grid.SyncGrid`, as any sync main does, and
returns the :class:`~fedcore.legacy.history.History`. With ``@app.main()`` it is
fedcore's ServerApp as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fedcore.apps.server_app import Main
from fedcore.apps.server_app import ServerApp as MessageServerApp
from fedcore.domain import Context
from fedcore.legacy.client_manager import ClientManager
from fedcore.legacy.grid_client_proxy import start_update_client_manager_thread
from fedcore.legacy.history import History
from fedcore.legacy.server import Server, init_defaults, run_fl
from fedcore.legacy.server_config import ServerAppComponents, ServerConfig
from fedcore.legacy.strategy import Strategy

_log = logging.getLogger("flwr")

ServerFn = Callable[[Context], ServerAppComponents]
M = TypeVar("M", bound=Main)

BOTH_MAIN_AND_COMPONENTS = (
    "Use either a custom main function or a `Strategy`, but not both: "
    "ServerApp(server_fn=...) returning ServerAppComponents(strategy=..., config=...), "
    "or ServerApp() with @app.main() on `def main(grid, context)`."
)


class ServerApp(MessageServerApp):
    """Flower's ``ServerApp(server=None, config=None, strategy=None, client_manager=None,
    server_fn=None)``; see the module docstring."""

    def __init__(
        self,
        server: Server | None = None,
        config: ServerConfig | None = None,
        strategy: Strategy | None = None,
        client_manager: ClientManager | None = None,
        server_fn: ServerFn | None = None,
    ) -> None:
        super().__init__()
        components = (server, config, strategy, client_manager)
        if any(part is not None for part in components):
            _log.warning(
                "DEPRECATED FEATURE: Passing either `server`, `config`, `strategy` or "
                "`client_manager` directly to the ServerApp constructor is deprecated. "
                "Return them in a `ServerAppComponents` from a function passed as "
                "`ServerApp(server_fn=...)` instead."
            )
            if server_fn is not None:
                raise ValueError(
                    "Passing `server_fn` is incompatible with passing the other arguments "
                    "(now deprecated) to ServerApp. Use `server_fn` exclusively."
                )
        self._components = ServerAppComponents(server, config, strategy, client_manager)
        self._server_fn = server_fn

    def main(self) -> Callable[[M], M]:
        """Register the Message-API ``main``; refused beside legacy components."""
        parts = self._components
        if any(
            p is not None
            for p in (parts.server, parts.config, parts.strategy, parts.client_manager)
        ):
            raise ValueError(BOTH_MAIN_AND_COMPONENTS)
        return super().main()

    def _checked_main(self) -> Main:
        """The registered ``main``; without one, the legacy compatibility mode's."""
        if self._main is not None:
            return self._main
        return self._legacy_main

    def _legacy_main(self, grid: Any, context: Context) -> History:
        """Flower's compatibility mode on the blocking ``grid``: the rounds of ``server_fn``'s
        (or the constructor's) components; the run's History."""
        components = self._server_fn(context) if self._server_fn is not None else self._components
        return start_grid(
            grid=grid,
            server=components.server,
            config=components.config,
            strategy=components.strategy,
            client_manager=components.client_manager,
        )


def start_grid(
    *,
    grid: Any,
    server: Server | None = None,
    config: ServerConfig | None = None,
    strategy: Strategy | None = None,
    client_manager: ClientManager | None = None,
) -> History:
    """Run a legacy server on the blocking ``grid``'s nodes; its History.

    What is not given gets Flower's default; the Grid's nodes are registered as
    clients while the rounds run, and the ``[SUMMARY]`` is logged at the end.
    """
    server, config = init_defaults(
        server=server, config=config, strategy=strategy, client_manager=client_manager
    )
    _log.info("Starting Flower ServerApp, config: %s", config)
    _log.info("")
    thread, stop, ready = start_update_client_manager_thread(grid, server.client_manager())
    ready.wait()
    try:
        return run_fl(server, config)
    finally:
        stop.set()
        thread.join()
