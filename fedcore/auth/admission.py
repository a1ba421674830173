"""The one admission path: a transport hands over what arrived, auth admits it or raises.

Every API that checks a credential — the fleet API's node signatures and sessions,
the exec API's shared-secret signatures, the control API's bearer token — does it
in the same two steps, through :func:`admit`: the :class:`Door` reads the
credential from the headers (:meth:`Door.present`, before any of the body is read,
so a request without one costs nothing more), then checks it, reading the body
only if the credential covers it (:meth:`Door.check`). A refusal is an
:class:`~fedcore.errors.AuthenticationError` (a
:class:`~fedcore.errors.WrongLinkError` carries the link's name); how it is told to
the peer is the transport's business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

Presented = TypeVar("Presented")
Admitted = TypeVar("Admitted")


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as its transport received it, nothing of it decoded."""

    method: str
    """The fleet method's path (``/fedcore.v1.Fleet/PullMessages``), or the HTTP method."""
    headers: Mapping[str, str | bytes]
    """The gRPC metadata or the HTTP headers, duplicates kept."""
    body: Callable[[], Awaitable[bytes]]
    """Reads the body (a call's first frame), under the transport's caps and timeouts."""
    path: str = ""
    """The HTTP path with its query string, as sent; empty for a gRPC call."""


AUTHORIZATION = "Authorization"


def bearer(headers: Mapping[str, str | bytes]) -> str:
    """The bearer credential of an HTTP request's ``Authorization``, or "" when there is none."""
    value = headers.get(AUTHORIZATION, "")
    scheme, _, credential = (value if isinstance(value, str) else "").partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


class Door(ABC, Generic[Presented, Admitted]):
    """One kind of credential, and the checks that admit it."""

    @abstractmethod
    def present(self, arrival: Arrival) -> Presented:
        """The credential ``arrival``'s headers carry, well formed; else ``AuthenticationError``."""

    @abstractmethod
    async def check(self, arrival: Arrival, presented: Presented) -> Admitted:
        """What admitting ``presented`` for ``arrival`` yields; else ``AuthenticationError``.

        Reads ``arrival.body()`` if the credential covers it (at most once).
        """


async def admit(door: Door[Presented, Admitted], arrival: Arrival) -> Admitted:
    """``arrival`` admitted by ``door``: its credential read from the headers, then checked."""
    return await door.check(arrival, door.present(arrival))
