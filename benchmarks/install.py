"""Install: a cold ``make demo`` on a fresh clone, as a new user's first command.

``python -m benchmarks.run install demo-cold`` clones this checkout's committed HEAD into a
temporary directory and runs ``make demo`` there with pip's cache off, so every package
is fetched and installed as on a machine that never saw fedcore: the venv built from
constraints.txt, then the demo's simulation. It reports the whole command's wall time and
the size of the venv it made; the target is under ``TARGET`` seconds. The heavy test
extras (torch, ray, the trackers) are ``make test``'s, not the demo's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 45.0


def _size(tree: Path) -> int:
    return sum(path.lstat().st_size for path in tree.rglob("*") if path.is_file())


def case(variant: str) -> dict[str, Any]:
    """The ``demo-cold`` case: seconds for ``make demo`` from a fresh clone, venv bytes."""
    if variant != "demo-cold":
        raise SystemExit(f"install has one case, 'demo-cold', not {variant!r}")
    with tempfile.TemporaryDirectory(prefix="fedcore-install-") as scratch:
        clone = Path(scratch) / "fedcore"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        environment = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
        started = time.perf_counter()
        made = subprocess.run(
            ["make", "demo"], cwd=clone, env=environment, capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        if made.returncode != 0:
            raise SystemExit(f"make demo failed in a fresh clone:\n{made.stderr[-4000:]}")
        return {
            "seconds": seconds,
            "target_seconds": TARGET,
            "venv_bytes": _size(clone / ".venv"),
            "load_average": os.getloadavg()[0],
        }
