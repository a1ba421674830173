"""Apps: ServerApp, ClientApp, App, the Grid they talk through, app loading and bundles.

Each name is imported from its module on first use: parsing a run config (the CLI)
needs none of the apps, nor numpy, and a worker loading its ClientApp none of the
bundle code.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.apps.app import App
    from fedcore.apps.bundle import Bundle, pack_bundle, unpack_bundle
    from fedcore.apps.client_app import CallNext, ClientApp, ClientAppCallable, Mod
    from fedcore.apps.grid import Grid, SyncGrid
    from fedcore.apps.lifespan import Lifespan
    from fedcore.apps.loading import LoadedApp, load_app
    from fedcore.apps.server_app import ServerApp

__all__ = [
    "App",
    "Bundle",
    "CallNext",
    "ClientApp",
    "ClientAppCallable",
    "Grid",
    "Lifespan",
    "LoadedApp",
    "Mod",
    "ServerApp",
    "SyncGrid",
    "load_app",
    "pack_bundle",
    "unpack_bundle",
]

_MODULES = {
    "app": ("App",),
    "bundle": ("Bundle", "pack_bundle", "unpack_bundle"),
    "client_app": ("CallNext", "ClientApp", "ClientAppCallable", "Mod"),
    "grid": ("Grid", "SyncGrid"),
    "lifespan": ("Lifespan",),
    "loading": ("LoadedApp", "load_app"),
    "server_app": ("ServerApp",),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
