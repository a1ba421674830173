"""A run's round checkpoint in its results directory: ``checkpoint.bin``.

The simulation keeps one checkpoint per results directory, the last complete round's
(:mod:`fedcore.strategy.checkpoint` says what it holds), so ``fedcore simulate
--resume DIR`` (:mod:`fedcore.results.resume`) can go on from it. Each one is written
beside the old one and moved over it (``os.replace``) once it is complete and on the
disk, so a run killed mid-write leaves the previous checkpoint whole. It is the wire
encoding of the checkpoint's RecordDict (:mod:`fedcore.wire.records`), arrays
written straight from the model's memory; the file goes when the run completes,
since its model is then in ``model.npz``.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio.to_thread

from fedcore.domain import RecordDict
from fedcore.errors import CheckpointError, DecodeError
from fedcore.strategy.checkpoint import Checkpoint
from fedcore.wire import Parts, pack_recorddict_parts, unpack_recorddict

CHECKPOINT_FILE = "checkpoint.bin"


class CheckpointFile:
    """The :class:`~fedcore.strategy.checkpoint.CheckpointStore` of a results directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE

    async def save(self, records: RecordDict) -> None:
        """Replace the checkpoint with ``records``, off the event loop. Encoded here,
        before the next round can change what it holds; written in a thread."""
        parts = pack_recorddict_parts(records)
        await anyio.to_thread.run_sync(self._write, parts)

    def _write(self, parts: Parts) -> None:
        temporary = self.path.with_name(f".{CHECKPOINT_FILE}.tmp")
        with temporary.open("wb") as stream:
            stream.writelines(parts)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, self.path)

    def remove(self) -> None:
        """Drop the checkpoint (the run completed)."""
        self.path.unlink(missing_ok=True)


def read_checkpoint(directory: Path) -> Checkpoint:
    """The checkpoint kept in results directory ``directory``; :class:`CheckpointError`
    when it has none or it is damaged."""
    path = directory / CHECKPOINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(
            f"{str(directory)!r} has no checkpoint: its run did not finish a round, or its "
            "main does not use a strategy's start (a hand-written round loop keeps none)"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {str(path)!r}: {exc}") from None
    try:
        return Checkpoint.from_records(unpack_recorddict(data))
    except DecodeError as exc:
        raise CheckpointError(f"{str(path)!r} is damaged: {exc}") from None
