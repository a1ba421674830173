"""Writing a run's results directory as the run goes: :class:`ResultsRecorder`.

The recorder is a logging handler: the engine logs the run's start (with a
:class:`~fedcore.simulation.engine.RunStarted`), the round driver each finished round
(with a :class:`~fedcore.strategy.result.RoundReport`), and everything else is a log
line — so it sees what a progress display sees, in the same process, without a
second channel. Each round's line is flushed as the round ends and ``run.json`` is
replaced atomically, so a run that dies (a SIGKILL included) leaves every round it
finished and says ``"running"``: it never ended.

Directory names sort by time: ``<UTC time>-<app>-<seed>``, with ``-2``, ``-3``… when
two runs start in the same second.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from fedcore.domain.records import ArrayRecord
from fedcore.errors import UsageError
from fedcore.results.metrics import fedcore_version, iso_time, round_row, run_header
from fedcore.strategy.result import Result, RoundReport

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "log.txt"
MODEL_FILE = "model.npz"
SUMMARY_FILE = "summary.png"
STOPPED_EARLY = "stopped_early_after_round"
"""``run.json``'s key for the round after which ``should_stop`` ended the run."""
DEFAULT_PARENT = Path("results")
"""Where ``fedcore simulate`` puts run directories unless told (``--out``, or:)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_name(app_name: str, seed: int | str, now: float) -> str:
    """What a run started ``now`` is called: ``<UTC time>-<app>-<seed>``, its directory's
    name (and its trackers' name for it when it keeps none). ``seed``: the run's seed,
    or what stands for it (a deployed run without one is named by its id)."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{_UNSAFE.sub('-', app_name).strip('-') or 'app'}-{seed}"


def new_run_directory(parent: Path, app_name: str, seed: int | str, now: float) -> Path:
    """A new, empty directory for a run under ``parent`` (made, with ``parent`` if need be)."""
    name = run_name(app_name, seed, now)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the results directory {str(parent)!r}: {exc}") from None
    for attempt in range(1, 1000):
        path = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot make the results directory {str(path)!r}: {exc}") from None
        return path
    raise UsageError(f"{str(parent)!r} has a thousand runs named {name!r}: clear some out")


def final_model(value: object) -> ArrayRecord | None:
    """The model a ServerApp's ``main`` returned, if it returned one."""
    if isinstance(value, ArrayRecord):
        return value
    if isinstance(value, Result):
        return value.arrays
    return None


def save_model(path: Path, model: ArrayRecord) -> None:
    """``model`` as ``model.npz``: an array per name, as ``numpy.load`` reads it back."""
    arrays = dict(zip(model.keys(), model.to_numpy_ndarrays(), strict=True))
    np.savez(path, **arrays)  # type: ignore[arg-type]


class ResultsRecorder(logging.Handler):
    """Writes ``path`` (an empty directory) for the run described by ``description``.

    ``description`` is ``run.json``'s opening content: what ran and how (app,
    config, seed, backend, nodes, resources). :meth:`finish` adds how it ended.

    A resumed run (:mod:`fedcore.results.resume`) passes the ``run.json`` its
    interrupted run left and ``resumed_after``, the round of its checkpoint: the record
    is running again, lists the resumption under ``"resumed"``, and gets no second
    header line in ``metrics.jsonl``.

    A round after which ``should_stop`` ended the run (its report says so) is written
    into ``run.json`` at once, as ``"stopped_early_after_round"``: the run stopped early,
    and where.
    """

    def __init__(
        self,
        path: Path,
        description: Mapping[str, Any],
        started: float,
        *,
        resumed_after: int | None = None,
    ) -> None:
        super().__init__(logging.INFO)
        self.path = path
        self._resumed = resumed_after is not None
        self._run: dict[str, Any] = dict(description)
        if resumed_after is None:
            self._run.update(fedcore=fedcore_version(), start=iso_time(started))
        else:
            self._run.pop("error", None)
            if self._run.get(STOPPED_EARLY, 0) > resumed_after:  # that round is done again
                del self._run[STOPPED_EARLY]
            resumption = {"at": iso_time(started), "after_round": resumed_after}
            self._run["resumed"] = [*self._run.get("resumed", []), resumption]
        self._run.update(end=None, status="running")
        self.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
        self._write_run()
        self._metrics: IO[str] = (path / METRICS_FILE).open("a", encoding="utf-8")
        self._log: IO[str] = (path / LOG_FILE).open("a", encoding="utf-8")
        self.reports: list[RoundReport] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self._log.closed:  # the run ended: what is logged after it is not its record
            return
        try:
            started = getattr(record, "fedcore_run", None)
            if started is not None and not self._resumed:
                self._run["run_id"] = started.run_id
                self._line(run_header(started.run_id, started.seed, started.run_config,
                                      started.started))  # fmt: skip
            report = getattr(record, "fedcore_round", None)
            if isinstance(report, RoundReport):
                self.reports.append(report)
                self._line(round_row(report))
                if report.stopped_early:
                    self._run[STOPPED_EARLY] = report.server_round
                    self._write_run()
            self._log.write(self.format(record) + "\n")
            self._log.flush()
        except Exception:
            self.handleError(record)

    def finish(self, value: object, status: str, ended: float, error: str | None = None) -> None:
        """Record how the run ended; the final model, if ``value`` is one; close the files.

        Writing the model may take a while for a large one: callers on an event loop
        run this in a thread.
        """
        model = final_model(value)
        if model is not None:
            save_model(self.path / MODEL_FILE, model)
        self._run.update(end=iso_time(ended), status=status)
        if error is not None:
            self._run["error"] = error
        self._write_run()
        self.close()

    def close(self) -> None:
        for stream in (self._metrics, self._log):
            if not stream.closed:
                stream.close()
        super().close()

    def _line(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def _write_run(self) -> None:
        write_run_file(self.path, self._run)


def write_run_file(path: Path, document: Mapping[str, Any]) -> None:
    """``run.json`` in the results directory ``path``, replaced whole: a reader never
    sees half of it."""
    temporary = path / f".{RUN_FILE}.tmp"
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path / RUN_FILE)


H = TypeVar("H", bound=logging.Handler)


@contextmanager
def recording(recorder: H) -> Iterator[H]:
    """Give ``recorder`` (a :class:`ResultsRecorder`, or a tracker's handler) every log
    record of the process while the block runs.

    fedcore's loggers are set to pass INFO on meanwhile (round reports are INFO),
    and put back after.
    """
    fedcore_logger = logging.getLogger("fedcore")
    saved = fedcore_logger.level
    if fedcore_logger.getEffectiveLevel() > logging.INFO:
        fedcore_logger.setLevel(logging.INFO)
    logging.getLogger().addHandler(recorder)
    try:
        yield recorder
    finally:
        logging.getLogger().removeHandler(recorder)
        fedcore_logger.setLevel(saved)
