"""Payloads and app bundles in chunks: split, verify as they stream, reassemble once.

No protobuf message on the fleet API may exceed :data:`~fedcore.wire.protobuf.FRAME_CAP`.
Content whose encoding is larger than :data:`CHUNK_SIZE` travels as a payload: split by
:func:`iter_chunks`, pushed or pulled as a stream, and described by a :class:`Digest`
(size and SHA-256). Chunks arrive in order, so a receiver checks each one as it comes
and hashes incrementally (:class:`ChunkVerifier`): it never holds more than one chunk
unless it wants the whole payload, which :class:`PayloadBuffer` writes into one buffer
allocated up front. That buffer is where decoding leaves it: the arrays of the
decoded RecordDict are views into it, so a payload is copied from the network once.
The link, which only relays payloads, uses the verifier and stores each chunk where
it likes, keeping memory at chunk size × concurrent transfers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

from fedcore.domain.fleet import Digest
from fedcore.wire._pb.fedcore import v1 as pb
from fedcore.wire.frame import DEFAULT_LIMITS, Buffer, Parts
from fedcore.wire.protobuf import FRAME_CAP, invalid

CHUNK_SIZE = FRAME_CAP - 64 * 1024
"""The most bytes of data in one chunk. The 64 KiB left of a frame hold the fields
around the data (ids, sizes, hashes, a message's metadata)."""


def digest_of_fields(size: int, sha256: bytes, what: str) -> Digest:
    try:
        return Digest(size, sha256)
    except ValueError as exc:
        invalid(f"{what}: {exc}", exc)


def iter_chunks(
    data: Buffer | Parts, digest: Digest, *, chunk_size: int = CHUNK_SIZE
) -> Iterator[pb.Chunk]:
    """Split a payload (or bundle) into chunks of at most ``chunk_size`` bytes, in order.

    ``data`` may be the parts :func:`fedcore.wire.pack_recorddict_parts` returns, so
    the arrays are copied only into one chunk at a time, never into a whole payload.
    An empty payload is one empty chunk. ``digest`` is ``Digest.of(data)``, passed in
    so that a sender who already knows it does not hash again.
    """
    if type(chunk_size) is not int or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    views = _views(data)
    size = sum(len(view) for view in views)
    if size != digest.size:
        raise ValueError(f"digest says {digest.size} bytes, but data has {size}")
    offset = 0
    pending: list[memoryview] = []
    filled = 0
    for view in views:
        while view:
            piece = view[: chunk_size - filled]
            view = view[len(piece) :]
            pending.append(piece)
            filled += len(piece)
            if filled == chunk_size:
                yield _chunk(offset, pending, digest)
                offset, pending, filled = offset + filled, [], 0
    if filled or not offset:
        yield _chunk(offset, pending, digest)


def _views(data: Buffer | Sequence[Buffer]) -> list[memoryview]:
    """Byte views of one buffer, or of each part of a payload, without copying."""
    parts = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    return [memoryview(part).cast("B") for part in parts]


def _chunk(offset: int, pieces: list[memoryview], digest: Digest) -> pb.Chunk:
    return pb.Chunk(
        offset=offset, data=b"".join(pieces), total_size=digest.size, sha256=digest.sha256
    )


class ChunkVerifier:
    """Checks a transfer chunk by chunk, without keeping it: order, size, cap and hash.

    The first chunk's total size is checked against ``max_size`` (and ``expected``,
    when the receiver knows what to expect) before anything is buffered; every
    chunk must start where the previous one ended, repeat the first one's size and
    hash, and not run past the end. A fault raises DecodeError and the transfer is
    over. Pass each chunk to :meth:`check` as it arrives and call :meth:`finish` at
    the end of the stream.
    """

    __slots__ = ("_declared", "_expected", "_hasher", "_max_size", "_received")

    def __init__(
        self, *, expected: Digest | None = None, max_size: int = DEFAULT_LIMITS.max_bytes
    ) -> None:
        if type(max_size) is not int or max_size < 0:
            raise ValueError(f"max_size must be a non-negative int, got {max_size!r}")
        if expected is not None:
            _check_cap(expected.size, max_size)
        self._expected = expected
        self._max_size = max_size
        self._declared: Digest | None = None
        self._received = 0
        self._hasher = hashlib.sha256()

    @property
    def received(self) -> int:
        """Bytes checked so far: where the next chunk must start."""
        return self._received

    def check(self, chunk: pb.Chunk) -> bytes:
        """Check the next chunk; return its data for the caller to store."""
        declared = digest_of_fields(
            chunk.total_size, chunk.sha256, f"chunk at offset {chunk.offset}"
        )
        if self._declared is None:
            _check_cap(declared.size, self._max_size)
            if self._expected is not None and declared != self._expected:
                invalid(
                    f"the transfer is {declared.size} bytes with SHA-256 {declared.sha256.hex()}; "
                    f"expected {self._expected.size} bytes with {self._expected.sha256.hex()}"
                )
            self._declared = declared
        elif declared != self._declared:
            invalid(f"chunk at offset {chunk.offset} declares another size or hash than the first")
        if chunk.offset != self._received:
            invalid(f"chunk at offset {chunk.offset}, expected offset {self._received}")
        data = chunk.data
        end = self._received + len(data)
        if end > declared.size:
            invalid(f"chunk at offset {chunk.offset} runs to byte {end}, past {declared.size}")
        if not data and declared.size:
            invalid(f"empty chunk at offset {chunk.offset}")
        self._hasher.update(data)
        self._received = end
        return data

    def finish(self) -> Digest:
        """Check the transfer is whole and its hash right; return its digest."""
        if self._declared is None:
            invalid("the transfer had no chunks")
        if self._received != self._declared.size:
            invalid(f"the transfer ended after {self._received} of {self._declared.size} bytes")
        if self._hasher.digest() != self._declared.sha256:
            invalid("the transfer's SHA-256 does not match: a chunk was corrupted")
        return self._declared


class PayloadBuffer:
    """Reassembles a transfer of known digest into one buffer, allocated once, up front.

    For a receiver that wants the whole payload, to decode it (a node fetching a
    message's content) or to unpack it (an app bundle). The digest is known from
    the message's :class:`PayloadRef` or the run's bundle digest, so the buffer is
    sized before the first byte arrives and never grows or copies; anything over
    ``max_size`` is refused before it is allocated.
    """

    __slots__ = ("_buffer", "_verifier")

    def __init__(self, expected: Digest, *, max_size: int = DEFAULT_LIMITS.max_bytes) -> None:
        self._verifier = ChunkVerifier(expected=expected, max_size=max_size)
        self._buffer = bytearray(expected.size)

    def add(self, chunk: pb.Chunk) -> None:
        """Check the next chunk and copy its data into place."""
        start = self._verifier.received
        data = self._verifier.check(chunk)
        self._buffer[start : start + len(data)] = data

    def finish(self) -> bytearray:
        """The whole payload, once complete and verified; it is not copied again."""
        self._verifier.finish()
        return self._buffer


def _check_cap(size: int, max_size: int) -> None:
    if size > max_size:
        invalid(f"a transfer of {size} bytes is over the cap of {max_size}")
