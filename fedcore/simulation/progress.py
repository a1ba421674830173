"""What a simulation shows while it runs: log lines, a live line, a summary.

``fedcore simulate`` and ``fedcore.simulate`` (from a script or a notebook) show the
same thing, through :func:`showing_progress`.

The round driver logs each finished round with a ``RoundReport`` attached and each
reply with a ``ReplyProgress``; :class:`ProgressDisplay` is a logging handler that
turns those into output. On a terminal, a live line at the bottom shows the
current round (replies, failures, elapsed) and log lines scroll above it; anywhere
else, it writes plain log lines only. It also appends one JSON line per round to
``--metrics-out`` as each round ends, so a crash loses nothing already done, and
keeps the reports for the closing summary. The metrics file is opened when the
run starts — the engine logs a :class:`~fedcore.simulation.engine.RunStarted`, which
becomes the file's header line for this run — so a run that fails to start leaves
no empty file behind.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from fedcore.results.metrics import round_row, run_header
from fedcore.simulation.engine import RunStarted
from fedcore.strategy.result import ReplyProgress, RoundReport, failures_text

_CLEAR = "\r\x1b[K"
_REDRAW_EVERY = 0.1


class ProgressDisplay(logging.Handler):
    """A logging handler that renders fedcore's run progress."""

    def __init__(
        self, stream: IO[str], *, show: int, live: bool, metrics_out: Path | None = None
    ) -> None:
        super().__init__(logging.DEBUG)
        self.stream = stream
        self.show = show
        self.live = live
        self.metrics_path = metrics_out
        self._metrics: IO[str] | None = None
        self.reports: list[RoundReport] = []
        self._live_line = ""
        self._last_redraw = 0.0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            progress: ReplyProgress | None = getattr(record, "fedcore_reply", None)
            report: RoundReport | None = getattr(record, "fedcore_round", None)
            started: RunStarted | None = getattr(record, "fedcore_run", None)
            if started is not None:
                self._start(started)
            if progress is not None:
                self._show_progress(progress, record.created)
                return
            if report is not None:
                self._record(report)
            if record.levelno >= self.show:
                self._print(self.format(record))
        except Exception:
            self.handleError(record)

    def _start(self, run: RunStarted) -> None:
        self._write(_header(run))

    def _record(self, report: RoundReport) -> None:
        self.reports.append(report)
        self._write(round_row(report))
        if self.live:
            self._live_line = ""

    def _write(self, row: dict[str, Any]) -> None:
        if self.metrics_path is None:
            return
        if self._metrics is None:
            self._metrics = self.metrics_path.open("a", encoding="utf-8")
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def _show_progress(self, progress: ReplyProgress, now: float) -> None:
        if not self.live:
            return
        done = progress.received == progress.expected
        if not done and now - self._last_redraw < _REDRAW_EVERY:
            return
        self._last_redraw = now
        self._live_line = (
            f"▸ round {progress.server_round}/{progress.num_rounds} · {progress.phase} "
            f"{progress.received}/{progress.expected} replies · {progress.failures} failures · "
            f"{max(now - progress.started, 0.0):.1f} s"
        )
        self.stream.write(_CLEAR + self._live_line)
        self.stream.flush()

    def _print(self, line: str) -> None:
        if self.live:
            self.stream.write(_CLEAR + line + "\n" + self._live_line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Erase the live line (the summary comes next) and close the metrics file."""
        if self.live and self._live_line:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self._live_line = ""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self.close()


def _header(run: RunStarted) -> dict[str, Any]:
    return run_header(run.run_id, run.seed, run.run_config, run.started)


def summary(reports: list[RoundReport], wall_time: float, seed: int, max_rows: int = 12) -> str:
    """The closing table — every round, or a sample with a line naming each gap — then
    the totals: replies of training and evaluation apart, failures by error code."""
    if not reports:
        return f"no rounds reported · {wall_time:.1f} s · seed {seed}"
    columns = _metric_columns(reports)
    header = ["round", "train", "evaluate", "failed", "time"] + [name for name, _, _ in columns]
    shown = _sample(reports, max_rows)
    rows = [
        [
            str(report.server_round),
            str(report.train_replies),
            str(report.evaluate_replies),
            str(report.failures),
            f"{report.elapsed:.2f}s",
            *(_cell(getattr(report, field).get(key)) for _, field, key in columns),
        ]
        for report in shown
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(header, widths, strict=True))]
    previous = 0
    for report, row in zip(shown, rows, strict=True):
        if report.server_round > previous + 1 and previous:
            lines.append(f"  ⋮ rounds {_span(previous + 1, report.server_round - 1)} not shown")
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
        previous = report.server_round
    train = sum(report.train_replies for report in reports)
    evaluate = sum(report.evaluate_replies for report in reports)
    lines.append(
        f"{len(reports)} rounds · {train + evaluate} replies ({train} train, {evaluate} evaluate)"
        f" · {failures_text(_tallies(reports))} · {wall_time:.1f} s · seed {seed}"
    )
    return "\n".join(lines)


def _tallies(reports: list[RoundReport]) -> Iterator[Mapping[str, int]]:
    for report in reports:
        yield report.train_failures
        yield report.evaluate_failures


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


_SCOPES = (("server_metrics", "server"), ("evaluate_metrics", "eval"), ("train_metrics", "train"))


def _metric_columns(reports: list[RoundReport]) -> list[tuple[str, str, str]]:
    """Up to six (title, report field, metric key) columns, server metrics first."""
    seen: dict[tuple[str, str, str], None] = {}
    for report in reports:
        for field, scope in _SCOPES:
            for key in getattr(report, field):
                seen[(f"{scope} {key}", field, key)] = None
    return list(seen)[:6]


def _sample(reports: list[RoundReport], max_rows: int) -> list[RoundReport]:
    if len(reports) <= max_rows:
        return reports
    step = (len(reports) - 1) / (max_rows - 1)
    picks = sorted({round(i * step) for i in range(max_rows)})
    return [reports[i] for i in picks]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return f"[{len(value)} values]"
    return f"{value:.4g}"


@contextmanager
def showing_progress(
    stream: IO[str],
    *,
    show: int,
    live: bool,
    verbose: bool = False,
    metrics_out: Path | None = None,
) -> Iterator[ProgressDisplay]:
    """Route logs to a :class:`ProgressDisplay` on ``stream`` while the block runs.

    fedcore's own loggers always pass round reports (INFO) on, so that the summary
    and ``--metrics-out`` are complete even when ``show`` hides them; the display
    decides what to print.
    """
    with ProgressDisplay(stream, show=show, live=live, metrics_out=metrics_out) as display:
        loggers = {
            logging.getLogger(): logging.DEBUG if verbose else logging.INFO,
            logging.getLogger("fedcore"): logging.DEBUG if verbose else logging.INFO,
            logging.getLogger("fedcore.strategy"): logging.DEBUG if live else logging.NOTSET,
        }
        saved = {logger: logger.level for logger in loggers}
        for logger, level in loggers.items():
            logger.setLevel(level)
        logging.getLogger().addHandler(display)
        try:
            yield display
        finally:
            logging.getLogger().removeHandler(display)
            for logger, level in saved.items():
                logger.setLevel(level)
