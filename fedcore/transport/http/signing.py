"""Requests signed with a shared secret: HMAC-SHA256 over the request, a timestamp and a nonce.

The exec API between a link and its execs (docs/security.md) authenticates each request
by three headers::

    X-Fedcore-Timestamp: 1700000000                  the sender's clock, whole Unix seconds
    X-Fedcore-Nonce: 9f86d081884c7d659a2feaa0c55ad015 random, never used twice
    X-Fedcore-Signature: <64 hex digits>             HMAC-SHA256(secret, the text below)

where the signed text is five lines joined by ``\\n``: the method (``POST``), the path
with its query string exactly as sent (``/v1/exec/claims``), the timestamp, the
nonce, and the SHA-256 of the body in hex (of no bytes for a request without one).
The separators keep the fields apart: no two different requests sign the same text.

:class:`Signer` makes the headers. :class:`Verifier` checks them: present and well
formed, a timestamp within ``max_skew`` seconds of its own clock (read before the
body), the signature (compared in constant time), and a nonce it has not accepted
before. It remembers each accepted nonce until its timestamp is too old to be
accepted anyway, so memory is bounded by the requests of one window, and it
remembers only nonces of correctly signed requests, so nobody without the secret
can fill it. Every refusal raises :class:`~fedcore.errors.UsageError` saying why —
for the server's log; the answer to the peer is the same whatever the cause.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from fedcore.clock import Clock
from fedcore.errors import UsageError

__all__ = ["MAX_SKEW", "NONCE", "SIGNATURE", "TIMESTAMP", "Signer", "Verifier"]

TIMESTAMP = "X-Fedcore-Timestamp"
NONCE = "X-Fedcore-Nonce"
SIGNATURE = "X-Fedcore-Signature"
MAX_SKEW = 30.0
"""Seconds a request's timestamp may differ from the receiver's clock, either way."""
MAX_NONCES = 100_000
"""Nonces remembered at once: more requests than this within one window are refused."""
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE = re.compile(r"[0-9A-Za-z_-]{16,64}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


def _signature(key: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    text = "\n".join((method, path, timestamp, nonce, hashlib.sha256(body).hexdigest()))
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _key(secret: str) -> bytes:
    if not secret:
        raise ValueError("the shared secret must not be empty")
    return secret.encode("utf-8")


class Signer:
    """Signs requests with ``secret``, stamped with ``clock``'s time."""

    def __init__(self, secret: str, clock: Clock) -> None:
        self._key = _key(secret)
        self._clock = clock

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The headers that authenticate this request (a fresh nonce each time)."""
        timestamp = str(int(self._clock.now()))
        nonce = secrets.token_hex(16)
        signature = _signature(self._key, method, path, timestamp, nonce, body)
        return {TIMESTAMP: timestamp, NONCE: nonce, SIGNATURE: signature}


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request's headers claim, well formed and fresh, not verified yet."""

    timestamp: str
    nonce: str
    signature: str


class Verifier:
    """Checks requests signed with ``secret`` against ``clock``; remembers their nonces."""

    def __init__(
        self,
        secret: str,
        clock: Clock,
        *,
        max_skew: float = MAX_SKEW,
        max_nonces: int = MAX_NONCES,
    ) -> None:
        if not max_skew > 0 or max_nonces < 1:
            raise ValueError("max_skew must be positive and max_nonces at least 1")
        self._key = _key(secret)
        self._clock = clock
        self._max_skew = max_skew
        self._max_nonces = max_nonces
        self._nonces: set[str] = set()
        self._forget: list[tuple[float, str]] = []
        """A heap of (when a nonce may be forgotten, the nonce)."""

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now (for tests of the bound)."""
        return len(self._nonces)

    def parse(self, headers: Mapping[str, str]) -> Signed:
        """The signature headers, if present, well formed and fresh; else ``UsageError``."""
        timestamp = headers.get(TIMESTAMP, "")
        nonce = headers.get(NONCE, "")
        signature = headers.get(SIGNATURE, "")
        if not (
            _TIMESTAMP.fullmatch(timestamp)
            and _NONCE.fullmatch(nonce)
            and _SIGNATURE.fullmatch(signature)
        ):
            raise UsageError("a signature header is missing or malformed")
        skew = int(timestamp) - self._clock.now()
        if abs(skew) > self._max_skew:
            raise UsageError(f"the timestamp is {skew:+.0f} s off this clock")
        return Signed(timestamp, nonce, signature)

    def verify(self, signed: Signed, method: str, path: str, body: bytes) -> None:
        """Accept the request once, if ``signed`` signs it; else ``UsageError``."""
        expected = _signature(self._key, method, path, signed.timestamp, signed.nonce, body)
        if not hmac.compare_digest(expected, signed.signature):
            raise UsageError("the signature does not match the request")
        now = self._clock.now()
        while self._forget and self._forget[0][0] < now:
            self._nonces.discard(heapq.heappop(self._forget)[1])
        if signed.nonce in self._nonces:
            raise UsageError("the nonce was used before (a replayed request)")
        if len(self._nonces) >= self._max_nonces:
            raise UsageError(f"over {self._max_nonces} requests within {self._max_skew:g} s")
        self._nonces.add(signed.nonce)
        # Past this time the timestamp is too old to pass parse(): the nonce can go.
        heapq.heappush(self._forget, (int(signed.timestamp) + self._max_skew, signed.nonce))
