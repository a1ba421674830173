"""Pictures of runs: each metric over rounds, several runs on one figure.

:func:`save_figure` draws with matplotlib (the ``[plots]`` extra, imported only
here, and only when a picture is asked for); :func:`terminal_plot` draws the same
in text, for a machine without it. Runs are labelled by what differs between them —
the seed, the backend, the node count, run-config values — so that a sweep reads
at a glance; one run alone is labelled by its app.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedcore.errors import UsageError
from fedcore.results.directory import SUMMARY_FILE
from fedcore.results.reading import RunResults, read_run

_DESCRIBING = ("app", "seed", "backend", "nodes")
"""run.json's keys that tell runs apart, besides the run config."""
_MAX_PANELS = 6


def chosen_metrics(runs: Sequence[RunResults], wanted: Sequence[str] = ()) -> list[str]:
    """The ``scope.key`` names to draw: those matching ``wanted`` (a full name, or a key
    in any scope: ``accuracy``), else every metric of the runs (up to six)."""
    present: dict[str, None] = {}
    for run in runs:
        present.update(dict.fromkeys(run.metric_names()))
    if not wanted:
        return list(present)[:_MAX_PANELS]
    chosen = []
    for name in wanted:
        matches = [m for m in present if m == name or m.partition(".")[2] == name]
        if not matches:
            known = ", ".join(present) or "none"
            raise UsageError(f"no run has a metric {name!r} (they have: {known})")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def labels(runs: Sequence[RunResults]) -> list[str]:
    """A label per run: what differs between them — the app first, then what the runs
    all have but set differently — or the app's name for a run alone. A run-config key
    of one app alone says nothing of another app's run, so it labels nothing; runs no
    key tells apart are named by their results directories."""
    described = [_described(run) for run in runs]
    shared = [
        key
        for key in dict.fromkeys(k for d in described for k in d)
        if all(key in d for d in described)
    ]
    differing = [key for key in shared if len({repr(d[key]) for d in described}) > 1]
    if not differing:
        names = [f"{run.run.get('app', run.path.name)}" for run in runs]
        return names if len(set(names)) == len(names) else [run.path.name for run in runs]
    return [", ".join(_part(key, d[key]) for key in differing) for d in described]


def _part(key: str, value: Any) -> str:
    return str(value) if key == "app" else f"{key}={value}"


def save_figure(runs: Sequence[RunResults], metrics: Sequence[str], out: Path) -> Path:
    """Draw ``metrics`` of ``runs`` into the image file ``out`` (its suffix picks the format)."""
    columns = min(len(metrics), 3)
    rows = math.ceil(len(metrics) / columns)
    figure = _figure(figsize=(4.2 * columns, 3.2 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    named = labels(runs)
    for panel, name in zip(axes.flat, metrics, strict=False):
        for run, label in zip(runs, named, strict=True):
            rounds, values = run.series(name)
            if rounds:
                panel.plot(rounds, values, marker="o" if len(rounds) < 30 else None, label=label)
        panel.set_title(name)
        panel.set_xlabel("round")
        panel.grid(alpha=0.3)
    for panel in list(axes.flat)[len(metrics) :]:
        panel.set_visible(False)
    figure.tight_layout()
    if len(runs) > 1:  # below the panels, one run a line: a long label hides no curve
        handles, texts = axes.flat[0].get_legend_handles_labels()
        figure.legend(handles, texts, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                      fontsize="small", frameon=False)  # fmt: skip
    try:
        figure.savefig(out, dpi=110, bbox_inches="tight")  # the legend inside the picture
    except OSError as exc:
        raise UsageError(f"cannot write {str(out)!r}: {exc}") from None
    return out


def draw_summary(path: Path) -> Path | None:
    """``summary.png`` in the results directory ``path``: every metric of its run over
    rounds. None, drawing nothing, without matplotlib or without metrics."""
    if not plotting_available():
        return None
    run = read_run(path)
    names = chosen_metrics([run])
    if not names:
        return None
    return save_figure([run], names, path / SUMMARY_FILE)


def plotting_available() -> bool:
    """Whether matplotlib can be imported here (the ``[plots]`` extra)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def terminal_plot(
    runs: Sequence[RunResults], metrics: Sequence[str], width: int = 60, height: int = 12
) -> str:
    """``metrics`` of ``runs`` drawn in text: a chart per metric, a mark per run."""
    marks = "*o+x#@%&"
    names = labels(runs)
    charts = []
    for name in metrics:
        series = [run.series(name) for run in runs]
        points = [(r, v) for rounds, values in series for r, v in zip(rounds, values, strict=True)]
        if not points:
            continue
        low_x, high_x = min(r for r, _ in points), max(r for r, _ in points)
        low_y, high_y = min(v for _, v in points), max(v for _, v in points)
        grid = [[" "] * width for _ in range(height)]
        for index, (rounds, values) in enumerate(series):
            for r, v in zip(rounds, values, strict=True):
                column = _scaled(r, low_x, high_x, width)
                row = height - 1 - _scaled(v, low_y, high_y, height)
                grid[row][column] = marks[index % len(marks)]
        lines = [name]
        for number, row_cells in enumerate(grid):
            edge = f"{high_y:>10.4g} ┤" if number == 0 else f"{low_y:>10.4g} ┤" if (
                number == height - 1) else " " * 10 + " │"  # fmt: skip
            lines.append(edge + "".join(row_cells))
        lines.append(" " * 11 + "└" + "─" * width)
        lines.append(" " * 12 + f"round {low_x}".ljust(width - 10) + f"{high_x:>10}")
        charts.append("\n".join(lines))
    legend = "  ".join(f"{marks[i % len(marks)]} {label}" for i, label in enumerate(names))
    return "\n\n".join([*charts, legend])


def _scaled(value: float, low: float, high: float, cells: int) -> int:
    if high == low:
        return cells // 2
    return min(cells - 1, int((value - low) / (high - low) * (cells - 1) + 0.5))


def _described(run: RunResults) -> dict[str, Any]:
    found = {key: run.run[key] for key in _DESCRIBING if key in run.run}
    config = run.run.get("config")
    if isinstance(config, dict):
        found.update((key, value) for key, value in config.items() if key != "seed")
    return found


def _figure(**options: Any) -> Any:
    """A matplotlib Figure of its own: not pyplot's, so that drawing a run's picture
    neither switches the caller's backend (a notebook's inline one) nor keeps figures."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            "drawing a picture needs matplotlib: pip install 'fedcore[plots]' "
            "(or --terminal for a text chart)"
        ) from None
    return Figure(**options)
