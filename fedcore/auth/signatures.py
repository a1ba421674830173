"""Signed fleet requests: every call a node makes carries its key and a signature in its metadata.

A fleet call's first request frame is signed, with five metadata entries (gRPC
headers; ASCII)::

    fedcore-node-key    base64 of the node's public key (DER SubjectPublicKeyInfo)
    fedcore-timestamp   the node's clock, whole Unix seconds
    fedcore-nonce       32 hex digits, random, never used twice
    fedcore-link        the name of the link the call is meant for (see below)
    fedcore-signature   base64 of the node key's signature over the text below

The signed text is the covered text of :mod:`fedcore.auth.stamps` with
``fedcore-fleet-v2`` first and the public key's base64 as sent for the claimant —
six lines: version, the method's path (``/fedcore.v1.Fleet/PullMessages``), the
timestamp, the nonce, the key, the SHA-256 of the frame in hex — then the link's
name, and a last line, when the call offers a session (:mod:`fedcore.auth.sessions`),
the offer's header as sent. So a signature is good for one method, one body, one
moment, one key and one link; a captured request replayed, sent to another method,
or with its body changed fails, and the link refuses a nonce it has seen
(:class:`~fedcore.auth.replay.ReplayGuard`).
A streamed upload signs its first frame, which names the message and the whole
upload's digest: the chunks after it cannot differ without failing that digest.

**The link's name** is random, new each time a link process starts
(:func:`~fedcore.auth.stamps.new_link_name`). The nonces a link remembers die with
its process; its name changes with it, so a request captured before a restart names
a link that no longer exists, and one captured at another link names that one:
either is refused (:class:`~fedcore.errors.WrongLinkError`) before its signature is
checked. A node learns the name from that same refusal, which carries it back in the
``fedcore-link`` trailer: its first call names
:data:`~fedcore.auth.stamps.NO_LINK_YET`, is refused, and goes again signed for the
name it was told; after a restart the same happens once. The name is no secret and
proves nothing about the link: it binds a signature to the link the node is talking
to, as that link names itself (docs/security.md).

Only the link decides what a valid signature admits (:mod:`fedcore.auth.fleet_gate`):
this module parses and checks, and raises
:class:`~fedcore.errors.AuthenticationError` for anything missing or malformed.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass

from fedcore.auth.keys import MAX_KEY_TEXT, NodeKey, PublicKey
from fedcore.auth.sessions import MAC, SESSION, SESSION_OFFER, MacRequest, decode_key, mac_request
from fedcore.auth.stamps import (
    NONCE,
    TIMESTAMP,
    covered_text,
    is_link_name,
    new_stamp,
    well_stamped,
)
from fedcore.errors import AuthenticationError
from fedcore.wire.frame import Buffer

NODE_KEY = "fedcore-node-key"
SIGNATURE = "fedcore-signature"
LINK = "fedcore-link"
_HEADERS = (NODE_KEY, TIMESTAMP, NONCE, LINK, SIGNATURE, SESSION_OFFER, SESSION, MAC)
_VERSION = "fedcore-fleet-v2"


def check_link_name(text: str) -> str:
    """``text`` if it has the form of a link's name; else ``AuthenticationError``."""
    if not is_link_name(text):
        raise AuthenticationError("the request's link header is malformed")
    return text


_BASE64 = re.compile(r"[A-Za-z0-9+/]{4,4096}={0,2}")


def _offered(offer: str) -> tuple[str, ...]:
    """The line a session offer adds to the signed text: none without one."""
    return (offer,) if offer else ()


def sign(
    key: NodeKey, method: str, frame: Buffer, now: float, *, link: str, offer: str = ""
) -> tuple[tuple[str, str], ...]:
    """The metadata that signs ``frame`` as the first request of a call to ``method``
    at the link named ``link``, offering a session when ``offer`` (an X25519 key's
    header value) is given."""
    encoded_key = base64.b64encode(key.public.der).decode("ascii")
    timestamp, nonce = new_stamp(now)
    lines = (check_link_name(link), *_offered(offer))
    text = covered_text(_VERSION, method, timestamp, nonce, encoded_key, frame, *lines)
    signature = key.sign(text)
    return (
        (NODE_KEY, encoded_key),
        (TIMESTAMP, timestamp),
        (NONCE, nonce),
        (LINK, link),
        (SIGNATURE, base64.b64encode(signature).decode("ascii")),
        *(((SESSION_OFFER, offer),) if offer else ()),
    )


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """What a call's metadata claims: well formed, not verified yet."""

    public_key: PublicKey
    timestamp: int
    nonce: str
    link: str
    """The name of the link the call claims to be meant for."""
    offer: bytes | None
    """The raw X25519 key of the session the call offers, if it offers one."""
    _encoded_key: str
    _signature: bytes
    _offer: str

    def verify(self, method: str, frame: Buffer, link: str) -> None:
        """Return if the signature signs ``frame`` for ``method`` at the link named
        ``link`` (the verifier's own name, never the one the call claims); else
        ``AuthenticationError``."""
        timestamp, lines = str(self.timestamp), (link, *_offered(self._offer))
        text = covered_text(
            _VERSION, method, timestamp, self.nonce, self._encoded_key, frame, *lines
        )
        self.public_key.verify(self._signature, text)


def credentials(metadata: Iterable[tuple[str, str | bytes]]) -> SignedRequest | MacRequest:
    """What a call's metadata presents: a session's MAC if it names a session, else a
    signature; ``AuthenticationError`` if neither is there whole and well formed."""
    values = _headers(metadata)
    if SESSION in values:
        return mac_request(values)
    return _signed(values)


def _headers(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """fedcore's authentication headers, each that is present exactly once."""
    entries: dict[str, list[str]] = {}
    for name, value in metadata:
        if name in _HEADERS:
            entries.setdefault(name, []).append(value if isinstance(value, str) else "")
    return {name: found[0] for name, found in entries.items() if len(found) == 1}


def _signed(values: dict[str, str]) -> SignedRequest:
    key, timestamp = values.get(NODE_KEY, ""), values.get(TIMESTAMP, "")
    nonce, signature = values.get(NONCE, ""), values.get(SIGNATURE, "")
    if not (
        len(key) <= MAX_KEY_TEXT
        and _BASE64.fullmatch(key)
        and well_stamped(timestamp, nonce)
        and _BASE64.fullmatch(signature)
    ):
        raise AuthenticationError("the request is not signed (fleet requests carry a node key)")
    if LINK not in values:
        raise AuthenticationError(
            f"the request names no link ({LINK}): it was signed as an older fedcore node "
            "signs (fedcore-fleet-v1), which a link restarted or another link would "
            "accept as well; upgrade the node"
        )
    link = check_link_name(values[LINK])
    try:
        der, raw_signature = base64.b64decode(key), base64.b64decode(signature)
    except binascii.Error:
        raise AuthenticationError("the request's signature headers are malformed") from None
    offer = values.get(SESSION_OFFER, "")
    raw_offer = decode_key(offer) if offer else None
    public_key = PublicKey.from_der(der)
    return SignedRequest(
        public_key, int(timestamp), nonce, link, raw_offer, key, raw_signature, offer
    )
