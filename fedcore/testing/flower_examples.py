"""Flower's own example apps, taken from a clone of Flower's repository, never copied here.

The tests that run Flower's examples as they are (and the side-by-side benchmarks)
extract each one from the repository ``$FEDCORE_FLOWER_REPO`` names at
:data:`FLOWER_COMMIT` (:mod:`fedcore.testing.flower_repo`), so every run sees the
same code: the apps of ``examples/`` (:func:`flower_example`) and the end-to-end test
apps of ``framework/e2e/`` (:func:`flower_e2e_app`).

Most examples load their data from the Hugging Face hub, which the tests cannot
reach. :func:`offline_environment` is the environment they run them in instead: the
tests' stand-ins for the data-loading libraries first on ``PYTHONPATH``, and W&B
switched off (tests/flower_apps/README.md says what each example needs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.testing.flower_repo import FlowerRepoUnavailable, extract_flower

OFFLINE_VARIABLES = {"WANDB_MODE": "disabled"}
"""Set for a Flower example's processes: W&B's own switch that makes ``wandb.init`` and
``wandb.log`` do nothing, as they must with no W&B account and no network."""


def offline_environment(
    stand_ins: Path, inherited: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """``inherited`` with ``stand_ins`` (the directory holding the stand-in packages)
    first on ``PYTHONPATH`` and :data:`OFFLINE_VARIABLES` set."""
    path = [str(stand_ins), *filter(None, inherited.get("PYTHONPATH", "").split(os.pathsep))]
    return {**inherited, "PYTHONPATH": os.pathsep.join(path), **OFFLINE_VARIABLES}


class FlowerExampleUnavailable(FlowerRepoUnavailable):
    """No clone of Flower's repository is named, or it lacks the example at the commit."""


def flower_example(name: str, into: Path) -> Path:
    """Flower's ``examples/NAME`` at :data:`FLOWER_COMMIT`, extracted under ``into``."""
    try:
        extract_flower([f"examples/{name}"], into)
    except FlowerRepoUnavailable as exc:
        raise FlowerExampleUnavailable(str(exc)) from None
    return into / "examples" / name


def flower_example_or_skip(name: str, into: Path) -> Path:
    """:func:`flower_example`, or the calling test skipped with the reason it is not there."""
    import pytest

    try:
        return flower_example(name, into)
    except FlowerExampleUnavailable as exc:
        pytest.skip(f"{exc} (tests/flower_apps)")


def flower_e2e_app(name: str, into: Path) -> Path:
    """Flower's ``framework/e2e/NAME`` at :data:`FLOWER_COMMIT`, extracted under ``into``."""
    try:
        extract_flower([f"framework/e2e/{name}"], into)
    except FlowerRepoUnavailable as exc:
        raise FlowerExampleUnavailable(str(exc)) from None
    return into / "framework" / "e2e" / name


def flower_e2e_app_or_skip(name: str, into: Path) -> Path:
    """:func:`flower_e2e_app`, or the calling test skipped with the reason it is not there."""
    import pytest

    try:
        return flower_e2e_app(name, into)
    except FlowerExampleUnavailable as exc:
        pytest.skip(f"{exc} (tests/flower_apps)")


# What Flower's examples leave behind, checked the same way whichever runtime ran them.

IRIS_FEATURES = ("SepalLengthCm", "SepalWidthCm")
"""The columns quickstart-pandas histograms."""


def logged_histograms(log_text: str) -> list[dict[str, list[int]]]:
    """quickstart-pandas' ``Aggregated histogram: {...}`` log lines, one dict a round."""
    rounds = []
    for line in log_text.splitlines():
        _, found, rest = line.partition("Aggregated histogram: ")
        if found:
            counts = re.findall(r"'(\w+)': array\(\[([\d\s,]*)\]\)", rest)
            rounds.append({name: [int(n) for n in re.findall(r"\d+", c)] for name, c in counts})
    return rounds


def iris_histograms(stand_ins: Path) -> dict[str, list[int]]:
    """The histograms of the stand-in iris table, whole: what quickstart-pandas must
    aggregate from its nodes' partitions. Computed in a process of its own, where the
    stand-in ``datasets`` package is importable, with the example's bins."""
    code = (
        "import json, numpy as np\n"
        "from datasets import load_dataset\n"
        "table = load_dataset('scikit-learn/iris', split='train').with_format('pandas')[:]\n"
        f"print(json.dumps({{c: np.histogram(table[c], bins=np.linspace(2.0, 10.0, 10))[0]"
        f".tolist() for c in {list(IRIS_FEATURES)!r}}}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=offline_environment(stand_ins),
        capture_output=True,
        text=True,
        check=True,
    )
    histograms: dict[str, list[int]] = json.loads(done.stdout)
    return histograms


def tensorboard_event_files(root: Path) -> dict[str, list[Path]]:
    """custom-mods' TensorBoard mod output under ``root`` (its ``.runs_history/RUN``):
    each node's directory name -> its event files."""
    [run] = (root / ".runs_history").iterdir()
    return {node.name: sorted(node.glob("events.out.tfevents.*")) for node in run.iterdir()}


def advanced_pytorch_results(
    outputs: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """advanced-pytorch's one run directory under ``outputs`` (``outputs/DATE/TIME``):
    its results.json (one entry a round), its run_config.json and the names of the
    checkpoints it saved."""
    [run_dir] = outputs.glob("*/*")
    results: list[dict[str, Any]] = json.loads((run_dir / "results.json").read_text())
    config: dict[str, Any] = json.loads((run_dir / "run_config.json").read_text())
    checkpoints = sorted(path.name for path in run_dir.glob("model_state_acc_*.pth"))
    return results, config, checkpoints


def advanced_pytorch_best_rounds(results: list[dict[str, Any]]) -> list[str]:
    """The checkpoints advanced-pytorch's strategy must have saved, worked out from its
    results: one for each round whose server accuracy beat every earlier round's."""
    best, names = 0.0, []
    for entry in results:
        accuracy = entry["evaluate_metrics_serverapp"]["accuracy"]
        if accuracy > best:
            best = accuracy
            names.append(f"model_state_acc_{accuracy}_round_{entry['round']}.pth")
    return sorted(names)


def xgboost_tree_count(path: Path) -> int:
    """The number of trees in the XGBoost model an example saved as JSON (its
    ``bst.save_model("final_model.json")``), read from the file: no xgboost needed."""
    model = json.loads(path.read_text())["learner"]["gradient_booster"]["model"]
    return len(model["trees"])


# Flower's baselines (``baselines/``): paper reproductions, most of them Hydra scripts.


def flower_baseline(path: str, into: Path) -> Path:
    """Flower's ``baselines/PATH`` (a baseline's project directory, the one its README
    runs ``python -m <package>.main`` from) at :data:`FLOWER_COMMIT`, extracted under
    ``into``."""
    try:
        extract_flower([f"baselines/{path}"], into)
    except FlowerRepoUnavailable as exc:
        raise FlowerExampleUnavailable(str(exc)) from None
    return into / "baselines" / path


def flower_baseline_or_skip(path: str, into: Path) -> Path:
    """:func:`flower_baseline`, or the calling test skipped with the reason it is not there."""
    import pytest

    try:
        return flower_baseline(path, into)
    except FlowerExampleUnavailable as exc:
        pytest.skip(f"{exc} (tests/legacy/README.md)")
