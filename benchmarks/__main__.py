"""Run every benchmark case, each in a fresh process; print a table, write benchmarks/results.json.

Each case runs in its own subprocess so that its time includes start-up and its
peak memory is its own. Ratios between rows of one invocation are comparable (same
machine, same moment); absolute figures vary from run to run. ``--repeat N`` runs
the selected cases N times, round robin (so that a noisy moment hits every case
alike), and reports each timed row's median: ``python -m benchmarks W2 --repeat 5``.

Before anything is timed, fedcore's and the benchmarks' bytecode is compiled, as pip
compiles an installed package's: with ``PYTHONDONTWRITEBYTECODE`` set (as in some
containers), every process would otherwise compile every module it imports from
source, and each case's start-up would time the compiler.
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"

CASES = [
    (workload, variant)
    for workload in ("W1", "W2", "W3")
    for variant in ("floor", "pool", "inline", "process")
] + [("W2", "cli"), ("100k", "process"), ("W3", "accuracy"), ("async", "race")]
CASES += [("startup", "help"), ("install", "demo-cold")]
CASES += [
    ("deploy", variant)
    for variant in (
        "rounds",
        "w1-50",
        "w1-50-sqlite",
        "heartbeats",
        "heartbeats-5s",
        "large",
        "large-memory",
        "large-400",
    )
]
CASES += [
    (workload, variant)
    for workload in ("W4", "W4-torch")
    if workload == "W4" or importlib.util.find_spec("torch") is not None
    for variant in ("floor", "capped", "uncapped", "floor-cli", "capped-cli", "uncapped-cli")
]
MIB = 2**20


def _one(workload: str, variant: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", workload, variant],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"{workload} {variant} failed:\n{completed.stderr}")
    row: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return row


def _arguments(argv: list[str]) -> tuple[set[str], int]:
    """The workloads named (none: all) and ``--repeat``'s count."""
    only, repeat = set(), 1
    words = iter(argv)
    for word in words:
        if word == "--repeat":
            count = next(words, "")
            if not count.isdigit() or int(count) < 1:
                raise SystemExit("--repeat takes a whole number of runs, at least 1")
            repeat = int(count)
        else:
            only.add(word)
    unknown = only - {workload for workload, _ in CASES}
    if unknown:
        raise SystemExit(f"no workload named {', '.join(sorted(unknown))}")
    return only, repeat


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for a case run several times: the run of median time, with every time."""
    if len(runs) == 1 or "seconds" not in runs[0]:
        return runs[0]
    ordered = sorted(runs, key=lambda row: row["seconds"])
    return ordered[len(ordered) // 2] | {
        "seconds": statistics.median(row["seconds"] for row in runs),
        "runs_seconds": [row["seconds"] for row in runs],
    }


def main() -> None:
    only, repeat = _arguments(sys.argv[1:])
    for tree in (HERE.parent / "fedcore", HERE):
        compileall.compile_dir(tree, quiet=1)
    cases = [case for case in CASES if not only or case[0] in only]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {case: [] for case in cases}
    for round_ in range(repeat):
        for workload, variant in cases:
            of = f" ({round_ + 1}/{repeat})" if repeat > 1 else ""
            print(f"running {workload} {variant}{of} ...", file=sys.stderr, flush=True)
            runs[workload, variant].append(_one(workload, variant))
    rows = [_median(runs[case]) for case in cases]
    floors = {
        (row["workload"], row["variant"]): row["seconds"]
        for row in rows
        if row["variant"] in ("floor", "pool")
    }
    print(f"{'workload':<9}{'variant':<9}{'wall s':>9}{'× floor':>9}{'× pool':>9}{'peak MiB':>10}")
    for row in rows:
        if row["variant"] == "accuracy":
            accuracies = ", ".join(f"{a:.3f}" for a in row["accuracies"])
            print(f"W3 round-30 accuracy, seeds 0-4: {accuracies}; mean {row['mean']:.4f}")
            continue
        if row["workload"] == "deploy":
            print(f"deploy   {row['variant']:<13}{_deployment(row)}")
            continue
        if row["workload"].startswith("W4"):
            continue  # a line of its own, below
        if row["workload"] == "startup":
            _startup(row)
            continue
        if row["workload"] == "install":
            print(
                f"install  cold make demo {row['seconds']:.1f} s "
                f"(target < {row['target_seconds']:g} s), venv {row['venv_bytes'] / MIB:.0f} MiB; "
                f"load avg {row['load_average']:.1f}"
            )
            continue
        if row["variant"] == "race":
            for entry in row["race"]:
                reached = ", ".join(
                    f"{target} after " + ("never" if seconds is None else f"{seconds:.2f} s")
                    for target, seconds in entry["seconds_to"].items()
                )
                print(
                    f"async    {entry['strategy']:<9}{entry['seconds']:>9.3f}  accuracy {reached}; "
                    f"final {entry['final_accuracy']:.3f}"
                )
            continue
        ratios = []
        for floor in ("floor", "pool"):
            base = floors.get((row["workload"], floor))
            ratio = row["seconds"] / base if base else None
            row[f"ratio_to_{floor}"] = ratio
            ratios.append(f"{ratio:>9.2f}" if ratio is not None else f"{'-':>9}")
        print(
            f"{row['workload']:<9}{row['variant']:<9}{row['seconds']:>9.3f}{''.join(ratios)}"
            f"{row['peak_bytes'] / 2**20:>10.1f}"
        )
    for workload in ("W4", "W4-torch"):
        of_workload = [row for row in rows if row["workload"] == workload]
        for line in (_threads(of_workload), _threads_cli(of_workload)):
            if line:
                print(f"{workload:<9}{line}")
    RESULTS.write_text(json.dumps({"when": time.strftime("%FT%T"), "rows": rows}, indent=2))
    print(f"figures written to {RESULTS}")


def _deployment(row: dict[str, Any]) -> str:
    """One deployment case's figures in a line (benchmarks/deployment.py says what they mean)."""
    load = f"; load avg {row['load_average']:.1f}"
    if "failed" in row:
        return f"FAILED: {row['failed']}{load}"
    if row["variant"].startswith("heartbeats"):
        return (
            f"{row['nodes']} nodes × 1 beat/{row['interval']:g} s for {row['window_seconds']:g} s: "
            f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, {row['beats']} beats, "
            f"{row['missed_slots']} slots missed, {row['online_after']} online after; "
            f"link CPU {row['link_cpu_percent']:.0f}%, RSS {row['link_rss_bytes'] / MIB:.0f} MiB; "
            f"load generator CPU {row['loadgen_cpu_percent']:.0f}%{load}"
        )
    if row["variant"].startswith("large"):
        return _large(row) + load
    rounds = (
        f"{row['nodes']} nodes, {row['model_floats'] * 4 / MIB:.2g} MiB model"
        if row["model_floats"] >= 2**18
        else f"{row['nodes']} nodes, {row['model_floats']}-float model"
    )
    if row["rounds"] > 5:
        times = (
            f"median {row['median_ms']:.1f} ms, p90 {row['p90_ms']:.1f} ms "
            f"(first round {row['first_round_ms']:.0f} ms)"
        )
    else:
        times = "rounds " + " / ".join(f"{ms / 1000:.2f}" for ms in row["round_ms"]) + " s"
    line = f"{rounds}, {row['rounds']} rounds: {times}; "
    line += f"link peak {row['link_peak_bytes'] / MIB:.0f} MiB"
    if "serverapp_peak_bytes" in row:
        line += (
            f", ServerApp peak {row['serverapp_peak_bytes'] / MIB:.0f} MiB; "
            f"load generator {row['loadgen_peak_bytes'] / MIB:.0f} MiB, "
            f"{row['loadgen_cpu_seconds']:.1f} CPU s; state {row['database']}"
        )
    return line + load


def _threads(rows: list[dict[str, Any]]) -> str:
    """W4's line: the pool's rounds with and without the thread cap, against the ideal.

    The ideal is the serial floor ÷ the pool's workers; each run's rounds (its workers
    started) are set against it, and the whole run's wall time follows.
    """
    by_variant = {row["variant"]: row for row in rows}
    if not {"floor", "capped", "uncapped"} <= set(by_variant):
        return ""
    floor, capped, uncapped = (by_variant[v] for v in ("floor", "capped", "uncapped"))
    ideal = floor["seconds"] / floor["workers"]
    for row in (capped, uncapped):
        row["ratio_to_ideal"] = row["rounds_seconds"] / ideal
    uncapped["ratio_to_capped"] = uncapped["rounds_seconds"] / capped["rounds_seconds"]
    return (
        f"serial at 1 thread {floor['seconds']:.2f} s, ideal ÷ {floor['workers']} workers "
        f"{ideal:.2f} s; rounds capped {capped['rounds_seconds']:.2f} s "
        f"({capped['ratio_to_ideal']:.2f} × ideal), uncapped {uncapped['rounds_seconds']:.2f} s "
        f"({uncapped['ratio_to_ideal']:.2f} × ideal, {uncapped['ratio_to_capped']:.2f} × capped); "
        f"whole runs {capped['seconds']:.2f} s / {uncapped['seconds']:.2f} s; load avg "
        + " / ".join(f"{row['load_average']:.1f}" for row in (floor, capped, uncapped))
    )


def _threads_cli(rows: list[dict[str, Any]]) -> str:
    """W4's line as a user meets it: whole processes, start-up included, capped or not."""
    by_variant = {row["variant"]: row["seconds"] for row in rows}
    if not {"floor-cli", "capped-cli", "uncapped-cli"} <= set(by_variant):
        return ""
    floor, capped, uncapped = (by_variant[v] for v in ("floor-cli", "capped-cli", "uncapped-cli"))
    return (
        f"as whole processes: serial {floor:.2f} s; fedcore simulate capped {capped:.2f} s "
        f"({capped / floor:.2f} × serial), uncapped {uncapped:.2f} s "
        f"({uncapped / floor:.2f} × serial, {uncapped / capped:.2f} × capped)"
    )


def _startup(row: dict[str, Any]) -> None:
    """One line per command line: its median wall time against the target and bare Python."""
    for line, seconds in row["commands"].items():
        verdict = "ok" if seconds < row["target_seconds"] else "OVER"
        print(
            f"startup  fedcore {line:<17}{seconds:>9.3f} s median of {row['repeats']} "
            f"(target < {row['target_seconds']:g} s: {verdict}; "
            f"bare python {row['python_seconds']:.3f} s)"
        )


def _large(row: dict[str, Any]) -> str:
    """The 200 MB echo's line: round times, and what each process held at its peak."""
    peaks = row["peaks"]
    held = "; ".join(
        f"{role} {peaks[role]['RssAnon'] / MIB:.0f} private + {peaks[role]['RssShmem'] / MIB:.0f} "
        f"shared + {peaks[role]['RssFile'] / MIB:.0f} file"
        for role in ("link", "node", "clientapp", "serverapp")
        if role in peaks
    )
    rounds = " / ".join(f"{ms / 1000:.2f}" for ms in row["round_ms"])
    return (
        f"{row['model_floats'] * 4 / 1e6:.0f} MB model to {row['nodes']} nodes and back, state "
        f"{row['database']}: rounds {rounds} s; private memory grew by "
        f"{row['link_private_growth_bytes'] / MIB:.0f} MiB in the link, "
        f"{row['node_private_growth_bytes'] / MIB:.0f} MiB in a node; peaks (MiB): {held}"
    )


if __name__ == "__main__":
    main()
