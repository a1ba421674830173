"""The TensorBoard tracker (``--track tensorboard[=DIR]``, the ``[tensorboard]`` extra).

It writes event files with the ``tensorboard`` package alone (its event writer and
protocol buffers: no TensorFlow, no PyTorch) into ``<results dir>/tensorboard``, or
into ``DIR/<run name>`` — so that ``tensorboard --logdir results`` (or ``DIR``) shows
every run side by side. Each round's metrics are scalars at step = round, flushed as
the round ends; the run's description is a table (text ``config``, at step 0) and how
it ended a text ``status`` at its last step. A run without a results directory
(``--no-save``) needs ``DIR``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_STRING
from tensorboard.plugins.text.metadata import create_summary_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from fedcore.errors import TrackerError
from fedcore.results.trackers.base import TrackedRun, Tracker, flat_description

DIRECTORY = "tensorboard"
"""The folder of a results directory the run's event files go in."""


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def start(self, run: TrackedRun) -> dict[str, str]:
        if self.where is not None:
            directory = Path(self.where) / run.name
        elif run.directory is not None:
            directory = run.directory / DIRECTORY
        else:
            raise TrackerError(
                "the tensorboard tracker writes into the results directory, and this run "
                "keeps none (--no-save): name a log directory, --track tensorboard=DIR"
            )
        try:
            self._writer = EventFileWriter(str(directory))
        except OSError as exc:
            raise TrackerError(f"the tensorboard tracker cannot write {directory}: {exc}") from None
        self._step = 0
        rows = [[key, value] for key, value in flat_description(run.description).items()]
        self._write(run.started, 0, _text("config", rows))
        self._writer.flush()
        return {"dir": str(directory)}

    def log_round(self, step: int, metrics: Mapping[str, float], at: float) -> None:
        values = [Summary.Value(tag=key, simple_value=value) for key, value in metrics.items()]
        self._write(at, step, values)
        self._step = step
        self._writer.flush()

    def finish(self, status: str, at: float) -> None:
        self._write(at, self._step, _text("status", [[status]]))
        self._writer.close()

    def _write(self, at: float, step: int, values: list[Summary.Value]) -> None:
        self._writer.add_event(Event(wall_time=at, step=step, summary=Summary(value=values)))


def _text(tag: str, rows: list[list[str]]) -> list[Summary.Value]:
    """A text summary: a table of ``rows`` (one cell alone is shown as text)."""
    cells = [cell.encode() for row in rows for cell in row]
    sizes = (len(rows), len(rows[0]) if rows else 0)
    shape = TensorShapeProto(dim=[TensorShapeProto.Dim(size=size) for size in sizes])
    tensor = TensorProto(dtype=DT_STRING, string_val=cells, tensor_shape=shape)
    return [Summary.Value(tag=tag, metadata=create_summary_metadata(tag, ""), tensor=tensor)]


TRACKER = TensorBoardTracker
