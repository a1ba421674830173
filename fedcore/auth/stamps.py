"""What every authenticated fleet call covers: its method, a timestamp, a nonce, who, the frame.

A signed call (:mod:`fedcore.auth.signatures`) and a call MAC'd in a session
(:mod:`fedcore.auth.sessions`) prove the same thing with different keys, so they
stamp and cover it the same way: two headers, ``fedcore-timestamp`` (the caller's
clock, whole Unix seconds) and ``fedcore-nonce`` (32 random hex digits, never used
twice), and a text of ``\\n``-joined lines — a version line naming the kind of
credential, the method's path, the timestamp, the nonce, who claims the call (a
public key's base64, or a session id), the SHA-256 of the first frame in hex, and
any lines the kind adds.

Both signed APIs of a link — the fleet API's node signatures and the exec API's HMAC
(:mod:`fedcore.auth.exec_signatures`) — also name the link a request is meant for:
a name each link process takes when it starts (:func:`new_link_name`), so that a
request captured before a restart, or at another link, is refused although the
nonces a link has seen die with its process. A caller learns the name from the
link's refusal of a call that named another (or :data:`NO_LINK_YET`).
"""

from __future__ import annotations

import hashlib
import re
import secrets

from fedcore.wire.frame import Buffer

TIMESTAMP = "fedcore-timestamp"
NONCE = "fedcore-nonce"
NO_LINK_YET = "-"
"""The link a caller names before it has learned its link's name: no link goes by it."""
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_LINK_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_link_name() -> str:
    """A name for a link process that has just started: 22 random URL-safe characters."""
    return secrets.token_urlsafe(16)


def is_link_name(text: str) -> bool:
    """Whether ``text`` has the form of a link's name (or of :data:`NO_LINK_YET`)."""
    return bool(_LINK_NAME.fullmatch(text))


def new_stamp(now: float) -> tuple[str, str]:
    """A call's timestamp and nonce header values at ``now``."""
    return str(int(now)), secrets.token_hex(16)


def well_stamped(timestamp: str, nonce: str) -> bool:
    """Whether the two header values have their forms."""
    return bool(_TIMESTAMP.fullmatch(timestamp) and _NONCE.fullmatch(nonce))


def covered_text(
    version: str, method: str, timestamp: str, nonce: str, claimant: str, frame: Buffer,
    *more: str,
) -> bytes:  # fmt: skip
    """The bytes a signature or MAC is computed over."""
    digest = hashlib.sha256(frame).hexdigest()
    lines = (version, method, timestamp, nonce, claimant, digest, *more)
    return "\n".join(lines).encode("ascii")
