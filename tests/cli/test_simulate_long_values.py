"""A record with a 3 MiB bytes and a 3 MiB str value, through `fedcore simulate` on every
backend; and a value over ``--max-value-bytes`` refused with one clear line.

The app (tests/deployment/big_values_app, which the deployment's large-message test runs
too) fails its run if a reply is not what it sent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FEDCORE = Path(sys.executable).parent / "fedcore"
BIG_VALUES = Path(__file__).resolve().parents[1] / "deployment" / "big_values_app"


def _simulate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FEDCORE), "simulate", str(BIG_VALUES), "-n", "2", "--no-save", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


@pytest.mark.parametrize(
    "backend", ["process", "inline", pytest.param("ray", marks=pytest.mark.ray)]
)
def test_3_mib_bytes_and_str_values_go_to_the_clientapps_and_back(
    tmp_path: Path, backend: str
) -> None:
    done = _simulate(tmp_path, "--backend", backend)

    assert done.returncode == 0, done.stderr
    assert "echoed 2 rounds" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_value_over_the_cap_fails_the_push_with_one_line(tmp_path: Path, backend: str) -> None:
    done = _simulate(tmp_path, "--backend", backend, "--max-value-bytes", str(1 << 20))

    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "error: config record 'config' holds 3145728 bytes of bytes in 'blob', over the cap "
        "of 1048576 bytes on one value (the simulation's cap: simulate(max_value_bytes=...), "
        "--max-value-bytes)"
    )
    assert "Traceback" not in done.stdout + done.stderr


def test_the_cap_is_inclusive(tmp_path: Path) -> None:
    done = _simulate(tmp_path, "--max-value-bytes", str(3 << 20), "--run-config", "rounds=1")

    assert done.returncode == 0, done.stderr
    assert "echoed 1 rounds" in done.stdout


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_reply_over_the_cap_is_an_error_reply(tmp_path: Path, backend: str) -> None:
    config = f"rounds=1 value-bytes=10 reply-extra-bytes={5 << 20}"
    done = _simulate(
        tmp_path, "--backend", backend, "--max-value-bytes", str(4 << 20), "--run-config", config
    )

    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith("RuntimeError: round 1: a node answered Error(code=2, "), last
    assert (
        "the reply could not be sent: config record 'config' holds 5242880 bytes of bytes in "
        "'extra', over the cap of 4194304 bytes on one value"
    ) in last
