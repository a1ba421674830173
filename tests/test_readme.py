"""The README's first-screen example runs (with a stand-in for the user's ``gradient``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def _first_python_block() -> str:
    match = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert match is not None, "README.md has no python example"
    return match.group(1)


def test_readme_example_runs() -> None:
    namespace: dict[str, object] = {"gradient": lambda w, partition: np.ones_like(w) * partition}
    exec(compile(_first_python_block(), str(README), "exec"), namespace)
    result = namespace["result"]
    arrays = result.value  # type: ignore[attr-defined]
    assert arrays["w"].shape == (10,)
    assert float(arrays["w"][0]) < 0
