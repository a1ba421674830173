"""Apps: ServerApp, ClientApp, App, the Grid they talk through, app loading and bundles."""

from fedcore.apps.app import App
from fedcore.apps.bundle import Bundle, pack_bundle, unpack_bundle
from fedcore.apps.client_app import ClientApp
from fedcore.apps.grid import Grid, SyncGrid
from fedcore.apps.loading import LoadedApp, load_app
from fedcore.apps.server_app import ServerApp

__all__ = [
    "App",
    "Bundle",
    "ClientApp",
    "Grid",
    "LoadedApp",
    "ServerApp",
    "SyncGrid",
    "load_app",
    "pack_bundle",
    "unpack_bundle",
]
