"""Node keys: the signing key a node proves itself with, and the public key the link knows it by.

A node signs every fleet request (:mod:`fedcore.auth.signatures`); the link binds the
node's id to its public key at registration. Three kinds of key are accepted —
Ed25519 (the default: small, fast, no parameters to get wrong), and ECDSA on P-256
or P-384 with SHA-256 / SHA-384 — and every other kind is refused where it is read,
RSA and the weaker curves included, with one line saying what is accepted.

Forms. A private key is kept as unencrypted PKCS #8 PEM (a file of mode 0600 is its
protection, as with an SSH host key). A public key is written in OpenSSH's one-line
form (``ssh-ed25519 AAAA… comment``), the form operators already paste into
authorized-keys files, and read in that form or as PEM. On the wire a public key is
its DER SubjectPublicKeyInfo: one canonical byte string per key, so two encodings of
the same key can never pass for two nodes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from typing import Literal

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from fedcore.errors import AuthenticationError, UsageError

KeyKind = Literal["ed25519", "p256", "p384"]
KEY_KINDS: tuple[KeyKind, ...] = ("ed25519", "p256", "p384")
DEFAULT_KIND: KeyKind = "ed25519"
_CURVES: dict[str, tuple[KeyKind, hashes.HashAlgorithm]] = {
    "secp256r1": ("p256", hashes.SHA256()),
    "secp384r1": ("p384", hashes.SHA384()),
}
_ACCEPTED = "Ed25519, ECDSA P-256 or ECDSA P-384"
MAX_KEY_TEXT = 16 * 1024
"""Bytes a key file or a key on the wire may have: a real one has a few hundred."""

_PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
_PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True, slots=True, eq=False)
class PublicKey:
    """A node's public key: what the link binds its id to and verifies its requests with."""

    _key: _PublicKey
    der: bytes
    """The canonical form: DER SubjectPublicKeyInfo."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.der == self.der

    def __hash__(self) -> int:
        return hash(self.der)

    @property
    def kind(self) -> KeyKind:
        return _kind(self._key)

    @property
    def fingerprint(self) -> str:
        """``SHA256:`` and the unpadded base64 of the key's SHA-256, as ``ssh-keygen -l`` has it."""
        digest = hashlib.sha256(self._openssh_blob()).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")

    def openssh(self, comment: str = "") -> str:
        """The key in OpenSSH's one-line form, with ``comment`` after it."""
        line = self._key.public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        ).decode("ascii")
        return f"{line} {comment}".rstrip()

    def verify(self, signature: bytes, data: bytes) -> None:
        """Return if ``signature`` signs ``data`` under this key; ``AuthenticationError`` if not."""
        try:
            if isinstance(self._key, ed25519.Ed25519PublicKey):
                self._key.verify(signature, data)
            else:
                self._key.verify(signature, data, ec.ECDSA(_CURVES[self._key.curve.name][1]))
        except InvalidSignature:
            raise AuthenticationError("the signature does not match the request") from None

    def _openssh_blob(self) -> bytes:
        return base64.b64decode(self.openssh().split()[1])

    @classmethod
    def from_der(cls, der: bytes) -> PublicKey:
        """The key whose DER SubjectPublicKeyInfo is ``der``; ``AuthenticationError`` if none."""
        if len(der) > MAX_KEY_TEXT:
            raise AuthenticationError("the public key is too long to be one")
        return _from_der(der)

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """A key in OpenSSH one-line form or PEM; ``UsageError`` for anything else."""
        text = text.strip()
        if len(text) > MAX_KEY_TEXT:
            raise UsageError("a public key is a few hundred characters, not this many")
        key: object  # PEM and OpenSSH loaders return different unions; _public checks it
        try:
            if text.startswith("-----BEGIN"):
                key = serialization.load_pem_public_key(text.encode("ascii"))
            else:
                key = serialization.load_ssh_public_key(text.encode("ascii"))
        except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm) as exc:
            raise UsageError(f"not a public key in OpenSSH or PEM form: {exc}") from None
        return _public(key, UsageError)


class NodeKey:
    """A node's private signing key."""

    def __init__(self, key: _PrivateKey) -> None:
        _kind(key)
        self._key = key
        self.public = _public(key.public_key(), UsageError)

    @classmethod
    def generate(cls, kind: KeyKind = DEFAULT_KIND) -> NodeKey:
        if kind == "ed25519":
            return cls(ed25519.Ed25519PrivateKey.generate())
        if kind not in KEY_KINDS:
            raise UsageError(f"unknown key kind {kind!r}; choose one of: {', '.join(KEY_KINDS)}")
        curve = ec.SECP256R1() if kind == "p256" else ec.SECP384R1()
        return cls(ec.generate_private_key(curve))

    @classmethod
    def from_pem(cls, data: bytes) -> NodeKey:
        """The key in PEM ``data`` (PKCS #8, or OpenSSH's private form); else ``UsageError``."""
        if len(data) > MAX_KEY_TEXT:
            raise UsageError("a private key is a few hundred bytes, not this many")
        key: object
        try:
            if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
                key = serialization.load_ssh_private_key(data, password=None)
            else:
                key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise UsageError(f"not an unencrypted private key in PEM form: {exc}") from None
        if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
            raise UsageError(f"a {type(key).__name__} is not accepted: use {_ACCEPTED}")
        return cls(key)

    def pem(self) -> bytes:
        """The key as unencrypted PKCS #8 PEM."""
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        if isinstance(self._key, ed25519.Ed25519PrivateKey):
            return self._key.sign(data)
        return self._key.sign(data, ec.ECDSA(_CURVES[self._key.curve.name][1]))


@functools.lru_cache(maxsize=4096)
def _from_der(der: bytes) -> PublicKey:
    """Parsed once per key, not once per request: a link hears the same thousand keys."""
    try:
        key = serialization.load_der_public_key(der)
    except ValueError:
        raise AuthenticationError("the public key is not a valid key") from None
    return _public(key, AuthenticationError)


def _kind(key: object) -> KeyKind:
    """The kind of ``key``; ``UsageError`` for a kind fedcore does not accept."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        accepted = _CURVES.get(key.curve.name)
        if accepted is not None:
            return accepted[0]
        raise UsageError(f"ECDSA on {key.curve.name} is not accepted: use {_ACCEPTED}")
    raise UsageError(f"a {type(key).__name__} is not accepted: use {_ACCEPTED}")


def _public(key: object, error: type[Exception]) -> PublicKey:
    try:
        _kind(key)
    except UsageError as exc:
        raise error(str(exc)) from None
    assert isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey)
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return PublicKey(key, der)
