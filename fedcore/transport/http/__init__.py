"""The control, runtime and exec APIs over HTTP (aiohttp): servers for any service, and clients."""

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
