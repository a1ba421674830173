"""The link's control API as ``fedcore run/ls/log/stop/pull/nodes`` reach it.

Over HTTP, or HTTPS given a TLS context, presenting the link's bearer token. The
commands import this when they call the link, not for ``--help``: the HTTP client
is most of their import time.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fedcore.runtime.addresses import Address
from fedcore.transport.control import ControlService
from fedcore.transport.http.control import HttpControlClient

__all__ = ["ControlService", "open_control"]


@asynccontextmanager
async def open_control(
    address: Address, tls: ssl.SSLContext | None, token: str | None
) -> AsyncIterator[ControlService]:
    """A client of the control API at ``address``, open for the block."""
    async with HttpControlClient(address.host, address.port, ssl=tls, token=token) as client:
        yield client
