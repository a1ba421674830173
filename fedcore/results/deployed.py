"""A deployed run's results directory, made from its record on the link.

The link keeps a run's record (the run, its log, its metrics lines and its final
model: :mod:`fedcore.state.base`); :class:`DeployedRecorder` writes it out as the
results directory ``fedcore simulate`` leaves, file for file, so that ``fedcore plot``
and :func:`~fedcore.results.reading.read_run` take either. ``fedcore pull`` writes
one at once; ``fedcore run --stream`` as the run goes, a line at a time, flushed as
it comes. The metrics lines are written as the ServerApp sent them; ``run.json``
says what ran from the ServerApp's header line (app, nodes, start, fedcore version)
and how it ended from the link's run (status, reason, when it finished), and is
replaced whole, never half-written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fedcore.domain import LogLine, MetricsLine, RecordDict, Run
from fedcore.errors import UsageError
from fedcore.results.directory import (
    LOG_FILE,
    METRICS_FILE,
    MODEL_FILE,
    STOPPED_EARLY,
    save_model,
    write_run_file,
)
from fedcore.results.metrics import fedcore_version, iso_time

BACKEND = "deployment"
"""What ``run.json`` says ran a deployed run, where a simulation names its backend."""


def directory_tag(run: Run) -> int | str:
    """What ends a deployed run's directory name: its seed, else ``run<id>``."""
    return run.seed if run.seed is not None else f"run{run.run_id}"


def run_document(
    run: Run, header: Mapping[str, Any] | None, stopped_after: int | None = None
) -> dict[str, Any]:
    """``run.json`` of a deployed run: what ran, from the ServerApp's ``header`` (``None``
    when it never started), and how it ended, from ``run`` as the link has it, and
    ``stopped_after``, the round after which ``should_stop`` ended it (a round line's
    ``stopped_early``)."""
    said = header or {}
    status = run.status.value.removeprefix("finished:")
    if header is not None and not run.status.finished:
        status = "running"  # its ServerApp has started, whatever the run was when last read
    document: dict[str, Any] = {
        "app": said.get("app", ""),
        "config": dict(run.run_config),
        "seed": run.seed,
        "backend": BACKEND,
        "nodes": said.get("nodes"),
        "fedcore": said.get("fedcore", fedcore_version()),
        "run_id": run.run_id,
        "start": said.get("started", iso_time(run.created_at)),
        "end": None if run.finished_at is None else iso_time(run.finished_at),
        "status": status,
    }
    if run.reason and run.status.finished:
        document["error"] = run.reason
    if stopped_after is not None:
        document[STOPPED_EARLY] = stopped_after
    return document


def open_directory(path: Path) -> Path:
    """``path``, made if need be, for a pulled run: refused if it holds anything already."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        taken = any(path.iterdir())
    except OSError as exc:
        raise UsageError(f"cannot make the results directory {str(path)!r}: {exc}") from None
    if taken:
        raise UsageError(f"{str(path)!r} is not empty: pull a run into a new directory")
    return path


class DeployedRecorder:
    """Writes the results directory ``path`` (empty) of the deployed run ``run``."""

    def __init__(self, path: Path, run: Run) -> None:
        self.path = path
        self.run = run
        self.header: dict[str, Any] | None = None
        self.rounds = 0
        self.stopped_after: int | None = None
        self._write_run()
        self._metrics: IO[str] = (path / METRICS_FILE).open("a", encoding="utf-8")
        self._log: IO[str] = (path / LOG_FILE).open("a", encoding="utf-8")

    def add_log(self, line: LogLine) -> None:
        """One log line, with the time the link got it."""
        stamp = time.strftime("%H:%M:%S", time.localtime(line.time))
        self._log.write(f"{stamp} {line.text}\n")
        self._log.flush()

    def add_metrics(self, line: MetricsLine) -> None:
        """One metrics line, as the ServerApp sent it; its first header completes ``run.json``."""
        document = line.document
        self._metrics.write(json.dumps(document) + "\n")
        self._metrics.flush()
        if "round" in document:
            self.rounds += 1
            if document.get("stopped_early") is True:
                self.stopped_after = document["round"]
                self._write_run()
        elif "run" in document and self.header is None:
            self.header = document
            self._write_run()

    def finish(self, run: Run, model: RecordDict | None) -> None:
        """How the run ended (``run`` as the link has it now), and its final model, if any.

        Writing the model may take a while for a large one: callers on an event loop
        run this in a thread.
        """
        arrays = model.array_records.get("arrays") if model is not None else None
        if arrays is not None:
            save_model(self.path / MODEL_FILE, arrays)
        self.run = run
        self._write_run()
        self.close()

    def close(self) -> None:
        for stream in (self._metrics, self._log):
            if not stream.closed:
                stream.close()

    def _write_run(self) -> None:
        write_run_file(self.path, run_document(self.run, self.header, self.stopped_after))
