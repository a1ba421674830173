"""The README's "on one machine" deployment, as written there, and what it guards against.

The lines start a link and three nodes, each with the partition its ClientApp reads;
without one, every message fails, and the run must say so rather than complete.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart-numpy"
ROUNDS = "num-server-rounds=2 fraction-train=1.0 fraction-evaluate=1.0"

pytestmark = pytest.mark.timeout(180)


def readme_nodes() -> list[str]:
    """The ``--node-config`` of each node the README's one-machine lines start."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("On one machine, for a try") :]
    block = block[: block.index("```", block.index("```sh") + 5)]
    (indices,) = re.findall(r"for i in ([\d ]+); do", block)
    (config,) = re.findall(r'--node-config "([^"]+)"', block)
    assert "$i" in config, "each node of the README's loop needs its own partition"
    return [config.replace("$i", index) for index in indices.split()]


def test_the_readmes_one_machine_lines_run_the_example(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for node_config in readme_nodes():
            federation.start_node(node_config)
        done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", ROUNDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KeyError" not in done.stdout
    assert re.search(r"round 2/2: 6 replies, 0 failures", done.stdout), done.stdout


def test_a_run_whose_nodes_lack_their_partition_fails_saying_why(tmp_path: Path) -> None:
    with Deployment(tmp_path) as federation:
        federation.start_link()
        for _ in range(3):
            federation.start_node("")
        done = federation.fedcore("run", str(QUICKSTART), "--stream", "--run-config", ROUNDS)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(
        r"finished:failed.*the last round \(2/2\) had no successful training reply: "
        r"3 failures \(code 2 ×3\)",
        done.stderr,
    ), done.stderr
