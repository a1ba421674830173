"""App: the ServerApp and ClientApp that make one federated application."""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.apps.client_app import ClientApp
from fedcore.apps.server_app import ServerApp


@dataclass(frozen=True)
class App:
    """A ServerApp with its ClientApp; what ``fedcore simulate`` and ``fedcore run`` start."""

    server: ServerApp
    client: ClientApp

    def __post_init__(self) -> None:
        if not isinstance(self.server, ServerApp):
            raise TypeError(
                f"App(server=...) must be a ServerApp, got {type(self.server).__name__}"
            )
        if not isinstance(self.client, ClientApp):
            raise TypeError(
                f"App(client=...) must be a ClientApp, got {type(self.client).__name__}"
            )
