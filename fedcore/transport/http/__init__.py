"""The control and runtime APIs over HTTP (aiohttp): servers for any service, and their clients."""

from fedcore.transport.http.control import HttpControlClient, control_app
from fedcore.transport.http.runtime import HttpRuntimeClient, runtime_app
from fedcore.transport.http.server import serve_http

__all__ = ["HttpControlClient", "HttpRuntimeClient", "control_app", "runtime_app", "serve_http"]
