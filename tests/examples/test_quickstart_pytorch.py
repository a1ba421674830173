"""The quickstart-pytorch example learns, reproducibly, in worker processes.

Skipped where torch is not installed (CI does not install it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import fedcore as fc
from fedcore.testing import round_reports

pytest.importorskip("torch")
pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"

pytestmark = pytest.mark.anyio


async def _accuracies(seed: int, caplog: pytest.LogCaptureFixture) -> list[float]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedcore"):
        await fc.simulate(EXAMPLE, nodes=20, backend="process", seed=seed)
    return [float(r.server_metrics["accuracy"]) for r in round_reports(caplog.records)]


async def test_reaches_085_within_the_default_rounds_and_repeats_exactly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = await _accuracies(0, caplog)
    assert len(first) == 20
    assert first[-1] >= 0.85
    assert first[-1] >= first[0] + 0.25  # it learned during the run, not before it
    assert first == await _accuracies(0, caplog)
