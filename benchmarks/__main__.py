"""Run every benchmark case, each in a fresh process; print a table, write benchmarks/results.json.

Each case runs in its own subprocess so that its time includes start-up and its
peak memory is its own. Ratios between rows of one invocation are comparable (same
machine, same moment); absolute figures vary from run to run.
"""

from __future__ import annotations

import json
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
] + [("100k", "process"), ("W3", "accuracy"), ("async", "race")]


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


def main() -> None:
    only = set(sys.argv[1:])
    rows = []
    for workload, variant in CASES:
        if only and workload not in only:
            continue
        print(f"running {workload} {variant} ...", file=sys.stderr, flush=True)
        rows.append(_one(workload, variant))
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
    RESULTS.write_text(json.dumps({"when": time.strftime("%FT%T"), "rows": rows}, indent=2))
    print(f"figures written to {RESULTS}")


if __name__ == "__main__":
    main()
