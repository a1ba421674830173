"""Fleet sessions: a node proves its key once, then authenticates its calls with a MAC.

Checking a signature on every call costs the link far more than an HMAC (the figures
are in docs/security.md), so a signed call may
carry an offer (``fedcore-session-offer``: an ephemeral X25519 public key, covered
by the call's signature), and the link answers it, in the response's headers, with
a session id and an X25519 key of its own (``fedcore-session``,
``fedcore-session-key``). Both sides derive the same 32-byte key (X25519, then
HKDF-SHA256 over the session id, both X25519 keys and the node's public key), and
the node's later unary calls carry instead of a signature::

    fedcore-session     the session id (22 URL-safe base64 characters)
    fedcore-timestamp   as a signed call's
    fedcore-nonce       as a signed call's
    fedcore-mac         base64 of HMAC-SHA256 over the text below

The text is :mod:`fedcore.auth.stamps`' covered text with ``fedcore-session-v1``
first and the session id for the claimant. So a MAC is good for one method, one body, one
moment and one session, and costs microseconds to check.

A call that carries many frames in a session (the Heartbeats stream) MACs each of
them too, in band (:class:`FrameSeal`): over ``fedcore-frame-v1``, the call's nonce,
the frame's number in the call and the frame's SHA-256, so a frame is good for one
place in one call only.

What it does not weaken: someone who reads the traffic learns both X25519 public
keys and not the session key; someone who rewrites the link's answer ends with a
key the link does not have, so every MAC'd call of the node is refused, and the
node signs again — a denial of service, which such a peer has anyway. The session
is only as good as the signature that opened it: the link keeps it for one node key,
admits it no longer than :data:`SESSION_SECONDS`, and checks the key against its
authorized list on every call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedcore.auth.stamps import NONCE, TIMESTAMP, covered_text, new_stamp, well_stamped
from fedcore.errors import AuthenticationError
from fedcore.wire.frame import Buffer

SESSION = "fedcore-session"
SESSION_KEY = "fedcore-session-key"
SESSION_OFFER = "fedcore-session-offer"
MAC = "fedcore-mac"
SESSION_SECONDS = 3600.0
"""How long the link admits a session from its opening; a node opens a new one halfway."""
_VERSION = "fedcore-session-v1"
_FRAME_VERSION = "fedcore-frame-v1"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{22}")
_B64_32 = re.compile(r"[A-Za-z0-9+/]{43}=")
"""32 bytes in base64: an X25519 key, an HMAC-SHA256."""
_RAW_KEY = 32


def session_key(
    shared: bytes, session_id: str, offer: bytes, answer: bytes, node_key: bytes
) -> bytes:
    """The session's MAC key, from the X25519 shared secret and what names the session."""
    info = b"\n".join((_VERSION.encode(), session_id.encode(), offer, answer, node_key))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def exchange(private: X25519PrivateKey, peer: bytes) -> bytes:
    """The X25519 shared secret of ``private`` and the raw public key ``peer``."""
    if len(peer) != _RAW_KEY:
        raise AuthenticationError("the session key is not an X25519 key")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer))
    except ValueError:  # a low-order point: no shared secret
        raise AuthenticationError("the session key is not a usable X25519 key") from None


def new_exchange_key() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 private key and its raw public key."""
    private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def encode_key(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_key(text: str) -> bytes:
    """A raw X25519 key from its header's base64; ``AuthenticationError`` if malformed."""
    if not _B64_32.fullmatch(text):
        raise AuthenticationError("the session key header is malformed")
    return base64.b64decode(text)


def new_session_id() -> str:
    return secrets.token_urlsafe(16)


def check_session_id(text: str) -> str:
    if not _SESSION_ID.fullmatch(text):
        raise AuthenticationError("the session id is malformed")
    return text


@dataclass(frozen=True, slots=True)
class MacRequest:
    """What a MAC'd call's metadata claims: well formed, not verified yet."""

    session_id: str
    timestamp: int
    nonce: str
    _mac: bytes

    def verify(self, key: bytes, method: str, frame: Buffer) -> None:
        """Return if the MAC is ``key``'s over ``frame`` for ``method``; else raise."""
        timestamp = str(self.timestamp)
        text = covered_text(_VERSION, method, timestamp, self.nonce, self.session_id, frame)
        if not hmac.compare_digest(hmac.digest(key, text, "sha256"), self._mac):
            raise AuthenticationError("the request's MAC is wrong")

    def seal(self, key: bytes) -> FrameSeal:
        """The seal of this call's frames, once ``key`` admitted its first."""
        return FrameSeal(key, self.nonce)


@dataclass(frozen=True, slots=True)
class FrameSeal:
    """The MACs of the frames of one call in a session: the call's nonce names the call."""

    key: bytes
    nonce: str

    def mac(self, number: int, frame: Buffer) -> bytes:
        """The MAC of ``frame`` as the call's frame ``number`` (0 first)."""
        digest = hashlib.sha256(frame).hexdigest()
        text = "\n".join((_FRAME_VERSION, self.nonce, str(number), digest)).encode("ascii")
        return hmac.digest(self.key, text, "sha256")

    def verify(self, number: int, frame: Buffer, mac: bytes) -> None:
        """Return if ``mac`` is this seal's for ``frame`` as frame ``number``; else raise."""
        if not hmac.compare_digest(self.mac(number, frame), mac):
            raise AuthenticationError(f"the MAC of the call's frame {number} is wrong")


def mac_metadata(
    session_id: str,
    key: bytes,
    method: str,
    frame: Buffer,
    now: float,
    stamp: tuple[str, str] | None = None,
) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates ``frame`` as a call to ``method`` in a session,
    stamped with ``stamp`` (a timestamp and nonce from :func:`new_stamp`) or a new one."""
    timestamp, nonce = stamp or new_stamp(now)
    text = covered_text(_VERSION, method, timestamp, nonce, session_id, frame)
    mac = hmac.digest(key, text, "sha256")
    return (
        (SESSION, session_id),
        (TIMESTAMP, timestamp),
        (NONCE, nonce),
        (MAC, base64.b64encode(mac).decode("ascii")),
    )


def mac_request(values: dict[str, str]) -> MacRequest:
    """The MAC'd call that ``values`` (each header once) claim; ``AuthenticationError`` if
    any of them is missing or malformed."""
    session_id, timestamp = values.get(SESSION, ""), values.get(TIMESTAMP, "")
    nonce, mac = values.get(NONCE, ""), values.get(MAC, "")
    if not (well_stamped(timestamp, nonce) and _B64_32.fullmatch(mac)):
        raise AuthenticationError("the request's session headers are malformed")
    try:
        raw = base64.b64decode(mac)
    except binascii.Error:
        raise AuthenticationError("the request's session headers are malformed") from None
    return MacRequest(check_session_id(session_id), int(timestamp), nonce, raw)


class Offer:
    """A node's side of a session being opened: its X25519 key, sent with a signed call."""

    def __init__(self) -> None:
        self._private, self._public = new_exchange_key()
        self.header = encode_key(self._public)
        """The ``fedcore-session-offer`` value."""

    def accept(
        self, answer: Mapping[str, str], node_key: bytes, now: float
    ) -> ClientSession | None:
        """The session the link's answer opens; None if the answer opens none (a link
        that does not offer sessions, or a malformed answer: the node keeps signing)."""
        session_id, link_key = answer.get(SESSION, ""), answer.get(SESSION_KEY, "")
        try:
            raw = decode_key(link_key)
            check_session_id(session_id)
            shared = exchange(self._private, raw)
        except AuthenticationError:
            return None
        key = session_key(shared, session_id, self._public, raw, node_key)
        return ClientSession(session_id, key, now + SESSION_SECONDS / 2)


@dataclass(frozen=True, slots=True)
class ClientSession:
    """A session a node holds: its calls are MAC'd with ``key`` until ``renew_at``."""

    session_id: str
    key: bytes
    renew_at: float

    def metadata(
        self, method: str, frame: Buffer, now: float, stamp: tuple[str, str] | None = None
    ) -> tuple[tuple[str, str], ...]:
        return mac_metadata(self.session_id, self.key, method, frame, now, stamp)

    def seal(self, nonce: str) -> FrameSeal:
        """The seal of the frames of a call stamped with ``nonce``."""
        return FrameSeal(self.key, nonce)
