"""TLS contexts for the listeners and the clients, from certificate files.

A listener reachable from other machines needs TLS unless ``--insecure``
(:func:`fedcore.runtime.addresses.check_exposure`); with a CA file too, clients must
present a certificate signed by it (mutual TLS). Unreadable or mismatched files are
a :class:`~fedcore.errors.UsageError` naming the file, at start-up.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from fedcore.errors import UsageError


def server_context(
    certfile: Path, keyfile: Path, ca_certfile: Path | None = None, *, alpn: list[str] | None = None
) -> ssl.SSLContext:
    """A server context; with ``ca_certfile``, clients must present a certificate it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
        if ca_certfile is not None:
            context.load_verify_locations(ca_certfile)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use the TLS files {certfile}, {keyfile}: {exc}") from None
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def client_context(
    root_certificates: Path | None = None,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    *,
    alpn: list[str] | None = None,
) -> ssl.SSLContext:
    """A client context trusting ``root_certificates`` (else the system's), with an optional
    client certificate for mutual TLS."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if root_certificates is not None:
            context.load_verify_locations(root_certificates)
        if certfile is not None:
            context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use the TLS files: {exc}") from None
    if alpn:
        context.set_alpn_protocols(alpn)
    return context
