"""The fleet's vocabulary: a digest checks its own fields and hashes parts as one payload."""

from __future__ import annotations

import hashlib

import pytest

from fedcore.domain.fleet import Digest


def test_digests_check_their_fields() -> None:
    with pytest.raises(ValueError, match="size"):
        Digest(-1, bytes(32))
    with pytest.raises(ValueError, match="size"):
        Digest(2**64, bytes(32))
    with pytest.raises(ValueError, match="sha256"):
        Digest(0, bytes(31))
    with pytest.raises(ValueError, match="sha256 must be 32 bytes, got a str"):
        Digest(0, "0" * 32)  # type: ignore[arg-type]


def test_a_digest_of_parts_is_the_digest_of_their_concatenation() -> None:
    parts = [b"ab", bytearray(b"c"), memoryview(b"def")]
    whole = b"abcdef"
    assert Digest.of(parts) == Digest.of(whole) == Digest(6, hashlib.sha256(whole).digest())
    assert Digest.of(b"") == Digest(0, hashlib.sha256(b"").digest())
