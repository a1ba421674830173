"""The README's first-screen example runs as a script (with a stand-in for ``gradient``)."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

PRELUDE = textwrap.dedent(
    """\
    import numpy as np


    def gradient(w, partition):
        return np.ones_like(w) * partition

    """
)
EPILOGUE = textwrap.dedent(
    """
    if __name__ == "__main__":
        w = result.value["w"]
        assert w.shape == (10,) and float(w[0]) < 0, w
        print("readme example ok")
    """
)


def _first_python_block() -> str:
    match = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert match is not None, "README.md has no python example"
    return match.group(1)


def test_readme_example_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(PRELUDE + _first_python_block() + EPILOGUE)
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "readme example ok" in completed.stdout


DOCTEST_PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]


def test_interactive_examples_print_what_they_show() -> None:
    """The ``>>>`` examples of the README and docs/ (the partitioners' table)."""
    runner = doctest.DocTestRunner()
    found = 0
    for page in DOCTEST_PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```\n(>>> .*?)```", text, re.DOTALL):
            found += 1
            runner.run(doctest.DocTestParser().get_doctest(block, {}, page.name, str(page), 0))
    assert found, "no >>> examples in the README or docs/"
    assert runner.summarize(verbose=False).failed == 0
