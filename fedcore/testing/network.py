"""A loopback port nothing listens on, for tests of what a client does when the link is away."""

from __future__ import annotations

import socket


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on: bound to find a free one, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
