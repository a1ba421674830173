"""W3's final model on each backend, computed once per test session."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

import fedcore as fc

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-numpy"


@functools.cache
def w3_model(backend: str) -> dict[str, np.ndarray]:
    """W3's final model (the quickstart-numpy example, seed 0) on ``backend``."""
    result = fc.run_simulation(EXAMPLE, nodes=100, seed=0, backend=backend, progress=False)
    return dict(result.value)


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Whether two models hold the same arrays, bit for bit (NaN payloads and -0.0 too)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
        for k in a
    )
