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

import re
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
BACKENDS = ("process", "inline")
SCRIPT = "simulation.py"
FAST = {("e2e-bare", mode) for mode in (*BACKENDS, SCRIPT)} | {
    ("e2e-pandas", SCRIPT),
    ("e2e-pandas", "inline"),
    ("e2e-pandas", "process"),  # its strategy's strings travel to the workers and back
    ("e2e-scikit-learn", "inline"),
}
"""The runs of a few seconds that CI's default selection keeps; the others, each process
of which imports torch, jax, Lightning or scikit-learn, take 10 to 45 s on a 2-core
machine and are marked ``slow`` (``make test-all``)."""


def runs(modes: tuple[str, ...]) -> list[object]:
    """``(app, mode)`` for each app and mode, marked as :data:`FAST` says."""
    params = []
    for name in APPS:
        for mode in modes:
            marks = [] if (name, mode) in FAST else [pytest.mark.slow]
            params.append(pytest.param(name, mode, marks=marks, id=f"{name}-{mode}"))
    return params


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


def assert_ran_cleanly(
    done: subprocess.CompletedProcess[str], *, rounds: int, evaluates: bool
) -> None:
    """Exit 0 (the app's own asserts held), no traceback anywhere in what it printed, and
    ``rounds`` rounds in which both clients trained (and evaluated) with no failure, as
    the legacy server logs them."""
    output = done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    assert "Traceback" not in output, output[-8000:]
    both_answered = [("2", "0")] * rounds
    assert re.findall(r"aggregate_fit: received (\d+) results and (\d+) failures", output) == (
        both_answered
    )
    assert re.findall(r"aggregate_evaluate: received (\d+) results and (\d+) failures", output) == (
        both_answered if evaluates else []
    )


@pytest.mark.parametrize(("name", "backend"), runs(BACKENDS))
def test_flowers_e2e_app_runs_unchanged(tmp_path: Path, name: str, backend: str) -> None:
    app_dir = e2e_app(name, tmp_path)

    done = fedcore_simulate(app_dir, ".", "--nodes", "2", "--backend", backend, "--seed", "0")

    # Every ServerApp runs 3 rounds; e2e-pandas' strategy evaluates on the server only.
    assert_ran_cleanly(done, rounds=3, evaluates=name != "e2e-pandas")


@pytest.mark.parametrize(("name", "script"), runs((SCRIPT,)))
def test_flowers_e2e_simulation_script_runs_unchanged(
    tmp_path: Path, name: str, script: str
) -> None:
    app_dir = e2e_app(name, tmp_path)

    done = fedcore_simulate(app_dir, script)

    # start_simulation(num_clients=2, config=ServerConfig(num_rounds=3)); e2e-pandas' 1.
    pandas = name == "e2e-pandas"
    assert_ran_cleanly(done, rounds=1 if pandas else 3, evaluates=not pandas)
