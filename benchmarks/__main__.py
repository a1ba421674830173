"""Run every benchmark, each in a fresh process, and print a table (and benchmarks/results.json).

Each case runs in its own subprocess so that its peak memory is its own. Ratios
between rows of one invocation are comparable (same machine, same moment); the
absolute figures vary from run to run.
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

CASES = [("W2", "floor"), ("W2", "inline"), ("W3", "floor"), ("W3", "inline"), ("W3", "accuracy")]


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
    rows = [_one(workload, variant) for workload, variant in CASES]
    floors = {row["workload"]: row["seconds"] for row in rows if row["variant"] == "floor"}
    print(f"{'workload':<10}{'variant':<10}{'wall s':>10}{'× floor':>10}{'peak MiB':>10}")
    for row in rows:
        if row["variant"] == "accuracy":
            accuracies = ", ".join(f"{a:.3f}" for a in row["accuracies"])
            print(f"W3 round-30 accuracy, seeds 0-4: {accuracies}; mean {row['mean']:.4f}")
            continue
        row["ratio_to_floor"] = row["seconds"] / floors[row["workload"]]
        print(
            f"{row['workload']:<10}{row['variant']:<10}{row['seconds']:>10.3f}"
            f"{row['ratio_to_floor']:>10.2f}{row['peak_bytes'] / 2**20:>10.1f}"
        )
    RESULTS.write_text(json.dumps({"when": time.strftime("%FT%T"), "rows": rows}, indent=2))
    print(f"figures written to {RESULTS}")


if __name__ == "__main__":
    main()
