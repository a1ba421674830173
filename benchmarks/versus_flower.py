"""fedcore against Flower 1.42 on the same Flower apps, as whole processes: ``make bench-flower``.

``python -m benchmarks.versus_flower [W2 W3 W4] [--repeat K] [--quick] --flower-python PATH``

Each workload is one Flower app directory under ``benchmarks/flower/`` (written against
Flower's Message API). It runs four ways, each a whole command as a user types it:

- ``flower``: Flower's simulation at its default client resources (1.42: 2 CPUs each),
  ``benchmarks/flower/simulate.py APP`` in Flower's environment (``--flower-python``);
- ``flower-1cpu``: the same with ``num_cpus=1``, so Flower runs as many Ray actors as
  fedcore runs workers;
- ``process`` and ``ray``: ``fedcore simulate APP --backend process|ray`` (fedcore's
  default of 1 CPU per ClientApp).

The K repetitions alternate (Flower, Flower at 1 CPU, process, ray, then again), so a
noisy moment on a shared machine hits all four alike; each row reports the median.
Time is the command's wall clock from start to exit; memory is the peak summed RSS
of its session and descendants (``benchmarks.measure.run_command``), Ray's daemons and
actors included. Each run's last ``final model`` / ``final accuracy`` line, which the
ServerApps log, is kept, so the rows can be checked to have computed the same thing.
Figures go to ``benchmarks/results-flower.json``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.measure import CommandRun, run_command

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
APPS = HERE / "flower"
RESULTS = HERE / "results-flower.json"
WORKLOADS = {"W2": "w2", "W3": "w3", "W4": "w4"}
RUNNERS = ("flower", "flower-1cpu", "process", "ray")
QUICK = {
    "W2": (100, {"num-server-rounds": 2}),
    "W3": (20, {"num-server-rounds": 3}),
    "W4": (20, {"num-server-rounds": 2}),
}
"""``--quick``: nodes and run-config overrides of a reduced trial (rounds of seconds)."""
DROPPED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAY_ADDRESS")
"""Left out of every command's environment: each framework sets its own thread caps, and
each starts a Ray of its own."""
FINAL = re.compile(r"final (model|accuracy): (.*)")
MIB = 2**20


def command(
    runner: str,
    app: Path,
    flower_python: Path,
    nodes: int | None = None,
    config: dict[str, int | float] | None = None,
) -> list[str]:
    """The command line of one runner, as a user types it; ``nodes`` and ``config``
    (run-config overrides) shrink a run, as ``--quick`` does. A fedcore runner is
    ``fedcore simulate``'s backend (``process``, ``ray``, ``inline``)."""
    overrides = [f"{key}={value}" for key, value in (config or {}).items()]
    sized = ["--nodes", str(nodes)] if nodes is not None else []
    if runner.startswith("flower"):
        argv = [str(flower_python), str(APPS / "simulate.py"), str(app), *sized]
        argv += [word for pair in overrides for word in ("--run-config", pair)]
        return argv + (["--num-cpus", "1"] if runner == "flower-1cpu" else [])
    fedcore = Path(sys.executable).parent / "fedcore"
    argv = [str(fedcore), "simulate", str(app), "--backend", runner, "--no-save", "--seed", "0"]
    return argv + sized + (["--run-config", " ".join(overrides)] if overrides else [])


def environment(runner: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in DROPPED}
    if runner.startswith("flower"):
        env.pop("PYTHONPATH", None)  # fedcore's tree has no business in Flower's process
        env["FLWR_TELEMETRY_ENABLED"] = "0"  # offline here; a user may leave it on
    return env


def one(workload: str, runner: str, flower_python: Path, quick: bool) -> dict[str, Any]:
    app = APPS / WORKLOADS[workload]
    if quick:
        nodes, config = QUICK[workload]
        argv = command(runner, app, flower_python, nodes, {"num-nodes": nodes, **config})
    else:
        argv = command(runner, app, flower_python)
    load = os.getloadavg()[0]
    run: CommandRun = run_command(argv, cwd=ROOT, env=environment(runner))
    if run.returncode != 0:
        raise SystemExit(f"{workload} {runner} failed ({run.returncode}):\n{run.output[-4000:]}")
    finals = FINAL.findall(run.output)
    return {
        "workload": workload,
        "runner": runner,
        "command": argv,
        "seconds": run.seconds,
        "peak_bytes": run.peak_bytes,
        "peak_processes": run.peak_processes,
        "leftovers": run.leftovers,
        "final": " ".join(finals[-1][1].split()) if finals else None,
        "load_average_before": load,
    }


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median time, with every run's time and memory."""
    ordered = sorted(runs, key=lambda row: row["seconds"])
    return ordered[len(ordered) // 2] | {
        "seconds": statistics.median(row["seconds"] for row in runs),
        "runs_seconds": [row["seconds"] for row in runs],
        "runs_peak_bytes": [row["peak_bytes"] for row in runs],
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row; fedcore's rows carry Flower's time ÷ theirs, both Flowers."""
    lines = [
        f"{'workload':<9}{'runner':<13}{'wall s':>9}{'peak MiB':>10}"
        f"{'Flower ÷':>10}{'Flower-1cpu ÷':>15}  final"
    ]
    by_key = {(row["workload"], row["runner"]): row for row in rows}
    for row in rows:
        ratios = ""
        if not row["runner"].startswith("flower"):
            for flower in ("flower", "flower-1cpu"):
                base = by_key.get((row["workload"], flower))
                ratio = base["seconds"] / row["seconds"] if base else None
                row[f"ratio_{flower}"] = ratio
                width = 10 if flower == "flower" else 15
                ratios += f"{ratio:>{width}.2f}" if ratio else f"{'-':>{width}}"
        else:
            ratios = f"{'':>10}{'':>15}"
        lines.append(
            f"{row['workload']:<9}{row['runner']:<13}{row['seconds']:>9.2f}"
            f"{row['peak_bytes'] / MIB:>10.0f}{ratios}  {_short(row['final'])}"
        )
    return lines


def _short(final: str | None) -> str:
    """A final line for the table: an accuracy, or a model's first value."""
    return "-" if final is None else final if len(final) <= 16 else final[:16] + " …"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="W2|W3|W4", help="default: all three")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, alternating")
    parser.add_argument("--quick", action="store_true", help="a reduced trial: few nodes, rounds")
    parser.add_argument("--flower-python", type=Path, default=ROOT / ".venv-flower/bin/python")
    args = parser.parse_args(argv)
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"no workload named {', '.join(sorted(unknown))}")
    if args.repeat < 1:
        parser.error("--repeat takes a whole number of runs, at least 1")
    if not args.flower_python.exists():
        parser.error(f"no Flower environment at {args.flower_python} (make bench-flower makes one)")
    for tree in (ROOT / "fedcore", HERE):
        compileall.compile_dir(tree, quiet=1)  # as pip compiles an installed package
    workloads = args.workloads or list(WORKLOADS)
    rows = []
    started = time.strftime("%FT%T")
    uptime_before = os.getloadavg()
    for workload in workloads:
        runs: dict[str, list[dict[str, Any]]] = {runner: [] for runner in RUNNERS}
        for repetition in range(args.repeat):
            for runner in RUNNERS:
                of = f" ({repetition + 1}/{args.repeat})" if args.repeat > 1 else ""
                print(f"running {workload} {runner}{of} ...", file=sys.stderr, flush=True)
                row = one(workload, runner, args.flower_python, args.quick)
                print(
                    f"  {row['seconds']:.2f} s, {row['peak_bytes'] / MIB:.0f} MiB, "
                    f"final {row['final']}",
                    file=sys.stderr,
                    flush=True,
                )
                for left in row["leftovers"]:
                    print(f"  ended a leftover process: {left}", file=sys.stderr)
                runs[runner].append(row)
        rows += [median_row(runs[runner]) for runner in RUNNERS]
    for line in table(rows):
        print(line)
    load = os.getloadavg()
    print(
        "load average before "
        + " / ".join(f"{value:.2f}" for value in uptime_before)
        + ", after "
        + " / ".join(f"{value:.2f}" for value in load)
        + f"; {os.cpu_count()} CPUs; repeat {args.repeat}"
        + ("; QUICK (reduced sizes)" if args.quick else "")
    )
    record = {
        "when": started,
        "quick": args.quick,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load_average_before": uptime_before,
        "load_average_after": load,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(record, indent=2))
    print(f"figures written to {RESULTS}")


if __name__ == "__main__":
    main()
