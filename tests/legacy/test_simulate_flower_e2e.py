"""Flower's own end-to-end test apps (``framework/e2e``) under ``fedcore simulate``, unchanged.

Flower's CI runs each of these legacy-API apps (``NumPyClient``, ``ClientApp(client_fn=)``,
``LegacyContext`` with ``DefaultWorkflow``, ``start_simulation``) and judges it by the
asserts the app makes on its ``History`` (its losses fall, or its histograms are
exactly iris'). Here each one is extracted from a clone of Flower's repository
(tests/flower_apps) and run as whole ``fedcore`` processes from its own directory, as
Flower's CI runs it: the app directory on the ``process`` and the ``inline`` backends,
and its ``simulation.py`` as ``fedcore simulate simulation.py``. A run passes when it
exits 0 — its asserts held — and printed no traceback.

Only data loading is replaced (tests/flower_apps/README.md): the processes run in
:func:`~fedcore.testing.flower_examples.offline_environment`, where the stand-ins answer
``torchvision.datasets.CIFAR10``, ``torchvision.transforms`` and ``flwr_datasets``
(MNIST) with synthetic data; e2e-pandas reads the ``data/client.csv`` Flower's CI
writes from scikit-learn's iris. jax, opacus and pytorch-lightning are the real ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.testing.flower_examples import flower_e2e_app_or_skip, offline_environment

STAND_INS = Path(__file__).resolve().parents[1] / "flower_apps" / "stand_ins"
FEDCORE = Path(sys.executable).parent / "fedcore"

# Each app -> the libraries it imports besides numpy and fedcore's flwr.
APPS = {
    "e2e-bare": (),
    "e2e-pandas": ("pandas", "sklearn"),
    "e2e-scikit-learn": ("sklearn",),
    "e2e-pytorch": ("torch", "tqdm"),
    "e2e-jax": ("jax", "sklearn"),
    "e2e-opacus": ("torch", "opacus"),
    "e2e-pytorch-lightning": ("torch", "pytorch_lightning"),
}
BACKENDS = ["process", "inline"]

pytestmark = pytest.mark.timeout(120)


def e2e_app(name: str, into: Path) -> Path:
    """Flower's ``framework/e2e/NAME``, extracted under ``into`` with what Flower's CI
    writes there before running it; the test skipped where a library it imports is not
    installed or no clone of Flower's repository is named."""
    for module in APPS[name]:
        pytest.importorskip(module)
    app_dir = flower_e2e_app_or_skip(name, into)
    if name == "e2e-pandas":
        # The CI's "Download dataset" step: the iris measurements scikit-learn ships.
        from sklearn.datasets import load_iris

        (app_dir / "data").mkdir()
        load_iris(as_frame=True)["data"].to_csv(app_dir / "data" / "client.csv")
    return app_dir


def fedcore_simulate(app_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fedcore simulate ARGS`` from ``app_dir``, in the offline environment."""
    return subprocess.run(
        [str(FEDCORE), "simulate", *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=app_dir,
        env=offline_environment(STAND_INS),
        check=False,
    )


def assert_ran_cleanly(done: subprocess.CompletedProcess[str]) -> None:
    """Exit 0 (the app's own asserts held) and no traceback anywhere in what it printed."""
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-8000:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", APPS)
def test_flowers_e2e_app_runs_unchanged(tmp_path: Path, name: str, backend: str) -> None:
    app_dir = e2e_app(name, tmp_path)

    done = fedcore_simulate(app_dir, ".", "--nodes", "2", "--backend", backend, "--seed", "0")

    assert_ran_cleanly(done)


@pytest.mark.parametrize("name", APPS)
def test_flowers_e2e_simulation_script_runs_unchanged(tmp_path: Path, name: str) -> None:
    app_dir = e2e_app(name, tmp_path)

    done = fedcore_simulate(app_dir, "simulation.py")

    assert_ran_cleanly(done)
