"""The control, runtime and exec APIs over HTTP (aiohttp): servers for any service, and clients.

Each name is imported from its module on first use: ``fedcore ls`` needs the control
client only, not the runtime API's message codecs (and numpy) nor the exec API's.
"""

import typing as _typing

from fedcore.lazy import lazy_attributes as _lazy_attributes

if _typing.TYPE_CHECKING:
    from fedcore.transport.http.control import HttpControlClient, control_app
    from fedcore.transport.http.exec import HttpExecClient, exec_app
    from fedcore.transport.http.runtime import HttpRuntimeClient, runtime_app
    from fedcore.transport.http.server import serve_http

__all__ = [
    "HttpControlClient",
    "HttpExecClient",
    "HttpRuntimeClient",
    "control_app",
    "exec_app",
    "runtime_app",
    "serve_http",
]

_MODULES = {
    "control": ("HttpControlClient", "control_app"),
    "exec": ("HttpExecClient", "exec_app"),
    "runtime": ("HttpRuntimeClient", "runtime_app"),
    "server": ("serve_http",),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}

if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all
    __getattr__, __dir__ = _lazy_attributes(globals(), _HOMES)
