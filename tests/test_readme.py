"""Every command the README shows runs as shown, and its example app runs as a script.

The README's commands are the lines of its ``sh`` blocks. Each block is claimed by one
test below, which runs the block's text as the README has it (a bash script, in a
directory of its own, with the ``fedcore`` of this environment on ``PATH``); a block no
test claims fails `test_every_readme_command_is_run_by_a_test`, as does a command
written in the prose (an inline ``fedcore simulate …``) that no block shows. Two lines
are not run here: ``make test`` is what CI runs (`test_ci_runs_make_test`), and ``make
test-fast`` runs a subset of the tests this file is part of.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
"""The ``bin/`` of the environment running the tests: where its ``fedcore`` is."""

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
        import asyncio

        w = result.value["w"]
        assert w.shape == (10,) and float(w[0]) < 0, w

        async def inline():
            return {inline}

        again = asyncio.run(inline())
        assert (again.value["w"] == w).all(), "the README's await form ran another model"
        print("readme example ok")
    """
)


def readme() -> str:
    return README.read_text(encoding="utf-8")


def sh_blocks(text: str) -> list[str]:
    """The README's ``sh`` blocks, each as written."""
    return re.findall(r"```sh\n(.*?)```", text, re.DOTALL)


def command_lines(block: str) -> list[str]:
    """A block's commands: its lines, continuations joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if command:
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def is_make_block(block: str) -> bool:
    return all(line.startswith("make ") for line in command_lines(block))


def is_activate_block(block: str) -> bool:
    return "source .venv/bin/activate" in command_lines(block)


def is_pip_block(block: str) -> bool:
    return any(line.startswith("pip install") for line in command_lines(block))


def is_deployment_block(block: str) -> bool:
    return any(line.startswith("fedcore serve") for line in command_lines(block))


def is_tour_block(block: str) -> bool:
    """A block of plain ``fedcore`` commands that end by themselves: run in order."""
    return all(line.startswith("fedcore ") for line in command_lines(block)) and not (
        is_deployment_block(block)
    )


CLAIMS: dict[str, Callable[[str], bool]] = {
    "make": is_make_block,
    "activate": is_activate_block,
    "pip": is_pip_block,
    "deployment": is_deployment_block,
    "tour": is_tour_block,
}
MAKE_TARGETS_RUN_ELSEWHERE = {
    "make test": "CI runs it (.ci/run): test_ci_runs_make_test",
    "make test-fast": "a subset of the tests this file belongs to",
}
INLINE_COMMAND = re.compile(r"`((?:fedcore|make|pip|python3?|source|\.venv/bin/\S+)(?: [^`]*)?)`")


def unclaimed_blocks(text: str) -> list[str]:
    """Blocks that no test claims, or that more than one would."""
    return [
        block for block in sh_blocks(text) if sum(claims(block) for claims in CLAIMS.values()) != 1
    ]


def unrun_inline_commands(text: str) -> list[str]:
    """Commands written in the prose that no block shows: ``fedcore simulate`` names a
    command (as ``make`` or ``python3`` alone name programs), ``fedcore simulate --nodes
    3`` shows one, and must be in a block."""
    shown = {line for block in sh_blocks(text) for line in command_lines(block)}
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    unrun = []
    for command in INLINE_COMMAND.findall(prose.replace("\n", " ")):
        words = command.split()
        a_name = len(words) == 1 or (
            words[0] == "fedcore" and len(words) == 2 and not words[1].startswith("-")
        )
        if not a_name and re.sub(r"\s+", " ", command) not in shown:
            unrun.append(command)
    return unrun


def test_every_readme_command_is_run_by_a_test() -> None:
    text = readme()
    assert sh_blocks(text), "README.md shows no commands"
    assert unclaimed_blocks(text) == []
    assert unrun_inline_commands(text) == []
    (make_block,) = [block for block in sh_blocks(text) if is_make_block(block)]
    assert set(command_lines(make_block)) == {"make demo", *MAKE_TARGETS_RUN_ELSEWHERE}


def test_the_coverage_checks_can_fail() -> None:
    text = (
        "Run `fedcore simulate`, then `fedcore simulate app --nodes 3` and `make bench`.\n\n"
        "```sh\nmake demo\nfedcore simulate app\n```\n\n```sh\nls -l\n```\n"
    )
    assert unclaimed_blocks(text) == sh_blocks(text)
    assert unrun_inline_commands(text) == ["fedcore simulate app --nodes 3", "make bench"]


def test_ci_runs_make_test() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "make test"


def _environment(**extra: str) -> dict[str, str]:
    """This environment's ``fedcore`` first on ``PATH``, as an activated venv has it."""
    env = {key: value for key, value in os.environ.items() if key != "FEDCORE_RESULTS"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _checkout_in(directory: Path) -> Path:
    """A directory standing for the checkout's top, as the README's lines expect it:
    its ``examples/``, and room for what the commands write."""
    (directory / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return directory


def _bash(
    script: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _only(claim: Callable[[str], bool]) -> list[str]:
    blocks = [block for block in sh_blocks(readme()) if claim(block)]
    assert blocks, "README.md has no such block"
    return blocks


@pytest.mark.timeout(300)
def test_make_demo(tmp_path: Path) -> None:
    """``make demo`` as the README's first screen shows it, in the checkout. Where its
    ``.venv`` is not this environment, or is not built yet, the command would build one
    first (CI's ``make test`` builds it): that is not done to the checkout from a test."""
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("the tests run outside the checkout's .venv, which make demo uses")
    stale = subprocess.run(
        ["make", "-q", ".venv/.demo-stamp"], cwd=ROOT, capture_output=True, check=False
    )
    if stale.returncode != 0:
        pytest.skip("make demo would install into .venv first: run it, or make test, once")
    done = subprocess.run(
        ["make", "demo"],
        cwd=ROOT,
        env=_environment(FEDCORE_RESULTS=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = tmp_path.iterdir()
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed", record
    assert record["nodes"] == 100
    assert (run / "model.npz").is_file()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1 + 30


def test_fedcore_on_the_path(tmp_path: Path) -> None:
    """The README's lines that put ``fedcore`` on the PATH, against a ``.venv`` that is
    this environment."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    for block in _only(is_activate_block):
        done = _bash(block, tmp_path, env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Usage: fedcore" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_install_into_an_environment_of_your_own(tmp_path: Path) -> None:
    """``pip install -e '.[examples,plots]'`` in a new environment, in the checkout: it
    gives that environment a working ``fedcore``. pip resolves from the pinned set, as
    ``make`` does (``PIP_CONSTRAINT``, in the environment, not on the line)."""
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_CONSTRAINT"] = str(ROOT / "constraints.txt")
    for block in _only(is_pip_block):
        done = _bash(block, ROOT, env, timeout=840)
        assert done.returncode == 0, done.stdout + done.stderr
    helped = subprocess.run(
        [str(venv / "bin" / "fedcore"), "--help"], capture_output=True, text=True, check=False
    )
    assert helped.returncode == 0, helped.stderr
    assert "Usage: fedcore" in helped.stdout


@pytest.mark.timeout(400)
def test_the_tour(tmp_path: Path) -> None:
    """The tour's commands, every block in order, in one directory, as a reader types
    them: each must succeed, and what they leave is what the README says."""
    checkout = _checkout_in(tmp_path)
    for block in _only(is_tour_block):
        done = _bash(block, checkout, _environment(), timeout=380)
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    runs = sorted((checkout / "results").iterdir())
    assert runs, "the tour's simulations left no results directory"
    for run in runs:
        assert json.loads((run / "run.json").read_text())["status"] == "completed"
        assert (run / "model.npz").is_file()
    assert (checkout / "my-app" / "pyproject.toml").is_file()
    assert (checkout / "rounds.png").stat().st_size > 0


def _private_network() -> bool:
    """Whether this machine lets a process have a loopback of its own (a user and a
    network namespace), where the README's fixed ports cannot meet another test's."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.timeout(400)
def test_the_one_machine_deployment(tmp_path: Path) -> None:
    """The README's link and three nodes, then ``fedcore run --stream``, as written:
    ports 9092 and 9093 included, on a loopback of the test's own (a network
    namespace), so that nothing else on the machine is bound or reached. The link and
    nodes the block leaves running are ended by the script's own job ids."""
    if not _private_network():
        pytest.skip("no user and network namespaces here (unshare): the block binds fixed ports")
    checkout = _checkout_in(tmp_path)
    (block,) = _only(is_deployment_block)
    script = "ip link set lo up\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" + block
    process = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-e", "-c", script],
        cwd=checkout,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=380)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, stdout + stderr
    assert re.search(r"round 30/30: \d+ replies, 0 failures", stdout + stderr), stdout + stderr
    (run,) = (checkout / "results").iterdir()
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "completed", record
    assert record["backend"] == "deployment"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme(), re.DOTALL)


def test_readme_example_runs_as_a_script(tmp_path: Path) -> None:
    """The example app, with a stand-in for ``gradient``, run as a script; then the
    ``await fc.simulate(...)`` the prose shows, which must give the same model."""
    (example,) = _python_blocks()
    (inline,) = re.findall(r"`(await fc\.simulate\([^`]*\))`", readme())
    script = tmp_path / "readme_example.py"
    script.write_text(PRELUDE + example + EPILOGUE.replace("{inline}", inline))
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "readme example ok" in completed.stdout


DOCTEST_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_interactive_examples_print_what_they_show() -> None:
    """The ``>>>`` examples of the README and docs/ (the partitioners' table)."""
    runner = doctest.DocTestRunner()
    found = 0
    for page in DOCTEST_PAGES:
        for block in re.findall(r"```\n(>>> .*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
            found += 1
            runner.run(doctest.DocTestParser().get_doctest(block, {}, page.name, str(page), 0))
    assert found, "no >>> examples in the README or docs/"
    assert runner.summarize(verbose=False).failed == 0
