"""Requests signed with a shared secret: HMAC-SHA256 over the request, a timestamp and a nonce.

The exec API between a link and its execs (docs/security.md) authenticates each request
by four headers::

    X-Fedcore-Timestamp: 1700000000                  the sender's clock, whole Unix seconds
    X-Fedcore-Nonce: 9f86d081884c7d659a2feaa0c55ad015 random, never used twice
    X-Fedcore-Link: 3q2-7wEjRVZ4mavN7_8ABQ            the link's name (below)
    X-Fedcore-Signature: <64 hex digits>             HMAC-SHA256(secret, the text below)

where the signed text is six lines joined by ``\\n``: the method (``POST``), the path
with its query string exactly as sent (``/v1/exec/claims``), the timestamp, the
nonce, the link's name, and the SHA-256 of the body in hex (of no bytes for a
request without one). The separators keep the fields apart: no two different
requests sign the same text.

The link's name is new at each start of the link (:mod:`fedcore.auth.stamps`), so a
request captured before a restart, or at another link that shares the secret, is
refused although the nonces seen before died with the process. The refusal of a
request that names another link carries the link's name in its own
``X-Fedcore-Link`` header; a :class:`Signer` starts with none
(:data:`~fedcore.auth.stamps.NO_LINK_YET`) and learns it so (:meth:`Signer.learn`).

:class:`Signer` makes the headers. :class:`Verifier`, the exec API's
:class:`~fedcore.auth.admission.Door`, checks them: present and well formed, a
timestamp within ``max_skew`` seconds of its own clock (read before the body), the
signature (compared in constant time), and a nonce it has not accepted before
(:class:`~fedcore.auth.replay.ReplayGuard`, which the fleet API's node signatures
use too). Every refusal raises :class:`~fedcore.errors.AuthenticationError`
saying why — for the server's log; the answer to the peer is the same whatever the
cause.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from fedcore.auth.admission import Arrival, Door
from fedcore.auth.replay import MAX_NONCES, MAX_SKEW, ReplayGuard
from fedcore.auth.stamps import NO_LINK_YET, is_link_name, new_link_name
from fedcore.clock import Clock
from fedcore.errors import AuthenticationError, WrongLinkError

__all__ = ["LINK", "MAX_SKEW", "NONCE", "SIGNATURE", "TIMESTAMP", "Signer", "Verifier"]

TIMESTAMP = "X-Fedcore-Timestamp"
NONCE = "X-Fedcore-Nonce"
LINK = "X-Fedcore-Link"
SIGNATURE = "X-Fedcore-Signature"
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE = re.compile(r"[0-9A-Za-z_-]{16,64}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


def _signature(
    key: bytes, method: str, path: str, timestamp: str, nonce: str, link: str, body: bytes
) -> str:
    text = "\n".join((method, path, timestamp, nonce, link, hashlib.sha256(body).hexdigest()))
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _header(headers: Mapping[str, str | bytes], name: str) -> str | None:
    value = headers.get(name)
    return value if isinstance(value, str) else None


def _key(secret: str) -> bytes:
    if not secret:
        raise ValueError("the shared secret must not be empty")
    return secret.encode("utf-8")


class Signer:
    """Signs requests with ``secret`` for the link named ``link``, stamped with ``clock``'s
    time (``link``: none yet, by default; see :meth:`learn`)."""

    def __init__(self, secret: str, clock: Clock, *, link: str = NO_LINK_YET) -> None:
        self._key = _key(secret)
        self._clock = clock
        self.link = link
        """The name of the link the requests are signed for."""

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The headers that authenticate this request (a fresh nonce each time)."""
        timestamp = str(int(self._clock.now()))
        nonce = secrets.token_hex(16)
        signature = _signature(self._key, method, path, timestamp, nonce, self.link, body)
        return {TIMESTAMP: timestamp, NONCE: nonce, LINK: self.link, SIGNATURE: signature}

    def learn(self, refusal: WrongLinkError) -> bool:
        """Sign for the name ``refusal`` told from now on; whether that is a new name (if
        not, or if it is no name, signing again would be refused again)."""
        if refusal.link == self.link or not is_link_name(refusal.link):
            return False
        self.link = refusal.link
        return True


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request's headers claim, well formed and fresh, not verified yet."""

    timestamp: str
    nonce: str
    link: str
    signature: str


class Verifier(Door[Signed, bytes]):
    """Checks requests signed with ``secret`` for the link named ``link`` (default: a new
    name, as a link process that starts takes) against ``clock``; remembers their nonces."""

    def __init__(
        self,
        secret: str,
        clock: Clock,
        *,
        max_skew: float = MAX_SKEW,
        max_nonces: int = MAX_NONCES,
        link: str | None = None,
    ) -> None:
        self._key = _key(secret)
        self._guard = ReplayGuard(clock, max_skew=max_skew, max_nonces=max_nonces)
        self.link = new_link_name() if link is None else link
        """The name requests must be signed for."""

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now (for tests of the bound)."""
        return self._guard.remembered

    def present(self, arrival: Arrival) -> Signed:
        return self.parse(arrival.headers)

    async def check(self, arrival: Arrival, presented: Signed) -> bytes:
        """The request's body, once the signature proved it comes from a holder of the secret."""
        body = await arrival.body()
        self.verify(presented, arrival.method, arrival.path, body)
        return body

    def parse(self, headers: Mapping[str, str | bytes]) -> Signed:
        """The signature headers, present, well formed and fresh; else ``AuthenticationError``."""
        timestamp = _header(headers, TIMESTAMP) or ""
        nonce = _header(headers, NONCE) or ""
        signature = _header(headers, SIGNATURE) or ""
        if not (
            _TIMESTAMP.fullmatch(timestamp)
            and _NONCE.fullmatch(nonce)
            and _SIGNATURE.fullmatch(signature)
        ):
            raise AuthenticationError("a signature header is missing or malformed")
        link = _header(headers, LINK)
        if link is None:
            raise AuthenticationError(
                f"the request names no link ({LINK}): it was signed as an older fedcore "
                "exec signs, which a link restarted or another link would accept as well; "
                "upgrade the exec"
            )
        if not is_link_name(link):
            raise AuthenticationError("a signature header is missing or malformed")
        self._guard.check_fresh(int(timestamp))
        return Signed(timestamp, nonce, link, signature)

    def verify(self, signed: Signed, method: str, path: str, body: bytes) -> None:
        """Accept the request once, if ``signed`` signs it for this link; else
        ``AuthenticationError`` (:class:`~fedcore.errors.WrongLinkError` for a request
        signed for another link's name, which carries this one's)."""
        if signed.link != self.link:
            raise WrongLinkError(
                f"the request is signed for the link {signed.link}, not this one "
                f"({self.link}): a request from before the link restarted, or meant for "
                "another link (an exec's first request is refused so too, and signs again)",
                self.link,
                learning=signed.link == NO_LINK_YET,
            )
        timestamp, nonce = signed.timestamp, signed.nonce
        expected = _signature(self._key, method, path, timestamp, nonce, self.link, body)
        if not hmac.compare_digest(expected, signed.signature):
            raise AuthenticationError("the signature does not match the request")
        self._guard.use_once(signed.nonce, int(signed.timestamp))
