"""Node keys: the kinds accepted, the forms read and written, signatures that fail rightly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from fedcore.auth.keys import KEY_KINDS, NodeKey, PublicKey
from fedcore.errors import AuthenticationError, UsageError


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_each_kind_signs_and_reads_back_in_every_form(kind: str) -> None:
    key = NodeKey.generate(kind)  # type: ignore[arg-type]
    assert key.public.kind == kind
    signature = key.sign(b"the request")
    key.public.verify(signature, b"the request")
    with pytest.raises(AuthenticationError, match="does not match"):
        key.public.verify(signature, b"the request!")
    with pytest.raises(AuthenticationError, match="does not match"):
        NodeKey.generate(kind).public.verify(signature, b"the request")  # type: ignore[arg-type]
    assert NodeKey.from_pem(key.pem()).public == key.public
    assert PublicKey.parse(key.public.openssh("a comment")) == key.public
    pem = key.public._key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert PublicKey.parse(pem.decode()) == key.public
    assert PublicKey.from_der(key.public.der) == key.public
    assert hash(PublicKey.from_der(key.public.der)) == hash(key.public)


def _pem(private: object) -> bytes:
    return private.private_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "RSAPrivateKey"),
        (lambda: ec.generate_private_key(ec.SECP224R1()), "secp224r1"),
        (lambda: ec.generate_private_key(ec.SECP256K1()), "secp256k1"),
        (lambda: ec.generate_private_key(ec.SECP521R1()), "secp521r1"),
    ],
    ids=["rsa", "p224", "secp256k1", "p521"],
)
def test_other_kinds_of_key_are_refused_where_they_are_read(make: object, what: str) -> None:
    private = make()  # type: ignore[operator]
    with pytest.raises(UsageError, match=f"{what}.*use Ed25519, ECDSA P-256 or ECDSA P-384"):
        NodeKey.from_pem(_pem(private))
    public = private.public_key()
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(AuthenticationError, match="not accepted"):
        PublicKey.from_der(der)
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(UsageError, match="not accepted"):
        PublicKey.parse(pem.decode())


@pytest.mark.parametrize("text", ["", "ssh-ed25519", "ssh-ed25519 AAAA", "hello", "x" * 20_000])
def test_what_is_not_a_public_key_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(UsageError):
        PublicKey.parse(text)


def test_bytes_that_are_not_a_key_on_the_wire_are_refused() -> None:
    with pytest.raises(AuthenticationError, match="not a valid key"):
        PublicKey.from_der(b"\x30\x03abc")


def test_an_encrypted_or_garbled_private_key_is_refused() -> None:
    encrypted = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(UsageError, match="unencrypted"):
        NodeKey.from_pem(encrypted)
    with pytest.raises(UsageError):
        NodeKey.from_pem(b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_the_fingerprint_is_the_one_ssh_keygen_shows(tmp_path: Path) -> None:
    key = NodeKey.generate()
    (tmp_path / "k.pub").write_text(key.public.openssh("c") + "\n")
    shown = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True
    ).stdout
    assert key.public.fingerprint in shown
