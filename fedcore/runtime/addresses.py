"""Listener addresses: ``HOST:PORT`` as typed on a command line, checked before binding.

Every listener of ``fedcore serve`` takes an address such as ``127.0.0.1:9092``,
``[::1]:0`` or ``link.example.org:9092``. Port 0 asks the system for a free port; the
bound port is then logged and written to the ``--ready-file`` (:mod:`.ready`), which is
how tests and scripts find it without racing for a port. A listener that is reachable
from other machines must use TLS: :func:`check_exposure` refuses to start one without
it unless the operator said ``--insecure`` (docs/security.md).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from fedcore.errors import UsageError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True, slots=True)
class Address:
    """A host and a TCP port (0: any free port)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Whether only this machine can reach the address."""
        if self.host.lower() in LOOPBACK_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a name other than localhost may resolve to anything


def parse_address(text: str, *, what: str = "address") -> Address:
    """``text`` as an :class:`Address`; ``UsageError`` naming ``what`` if it is not one.

    IPv6 hosts go in brackets (``[::1]:9092``), as in URLs. The port is required: a
    default port would hide which one a test or a firewall rule should expect.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    host, colon, port_text = text.strip().rpartition(":")
    if not colon or not host:
        raise UsageError(f"{what} {text!r} must be HOST:PORT, e.g. 127.0.0.1:9092 or [::1]:0")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        _check_ip(host, text, what, version=6)
    elif ":" in host:
        raise UsageError(f"{what} {text!r}: put an IPv6 host in brackets, e.g. [::1]:9092")
    elif host.replace(".", "").isdigit():
        _check_ip(host, text, what, version=4)
    elif not _is_hostname(host):
        raise UsageError(f"{what} {text!r}: {host!r} is not a valid host name")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"{what} {text!r}: the port must be a number from 0 to 65535")
    return Address(host, int(port_text))


def check_exposure(
    address: Address, *, tls: bool, insecure: bool, what: str, certificates: str = "certificates"
) -> None:
    """Refuse a listener other machines can reach without TLS, unless ``insecure``.

    ``certificates`` names the flags that would give it TLS, for the message.
    """
    if tls or insecure or address.is_loopback:
        return
    raise UsageError(
        f"{what} {address} is reachable from other machines but has no TLS: give "
        f"{certificates}, listen on 127.0.0.1, or pass --insecure to accept plaintext"
    )


def _check_ip(host: str, text: str, what: str, *, version: int) -> None:
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"{what} {text!r}: {host!r} is not an IPv{version} address") from None
    if parsed.version != version:
        raise UsageError(f"{what} {text!r}: {host!r} is not an IPv{version} address")


def _is_hostname(host: str) -> bool:
    """RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens."""
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        for label in labels
    )
