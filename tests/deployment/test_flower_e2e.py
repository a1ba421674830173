"""Two of Flower's own end-to-end test apps under ``fedcore run``, unchanged, on a link
with two nodes: e2e-bare and e2e-pytorch, legacy-API apps (``NumPyClient``,
``ClientApp(client_fn=)``, ``LegacyContext`` with ``DefaultWorkflow``) that Flower's CI
also runs on a SuperLink with two SuperNodes (its ``test_superlink.sh``).

Each app comes from a clone of Flower's repository (tests/flower_apps) and only its
data loading is replaced: the link and the nodes run in
:func:`~fedcore.testing.flower_examples.offline_environment`, whose ``PYTHONPATH`` the
app processes get, so e2e-pytorch's ``torchvision.datasets.CIFAR10`` is the stand-in's.
The app judges itself: its ServerApp asserts on the ``History`` its workflow filled
(the distributed loss did not rise), so the run completes only if that held.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedcore.testing.deployment import Deployment
from fedcore.testing.flower_examples import flower_e2e_app_or_skip, offline_environment

STAND_INS = Path(__file__).resolve().parents[1] / "flower_apps" / "stand_ins"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    """A link and two nodes (partitions 0 and 1 of 2), in the offline environment."""
    for name, value in offline_environment(STAND_INS).items():
        monkeypatch.setenv(name, value)
    with Deployment(tmp_path / "deployment", heartbeat_interval=1.0) as running:
        running.start_link()
        for index in range(2):
            running.start_node(f"partition-id={index} num-partitions=2")
        yield running


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("e2e-bare", ()),
        # 15 to 60 s here: each node's ClientApp process imports torch and builds its loaders.
        pytest.param("e2e-pytorch", ("torch", "tqdm"), marks=pytest.mark.slow),
    ],
)
def test_flowers_e2e_app_runs_as_it_is(
    deployment: Deployment, tmp_path: Path, name: str, needs: tuple[str, ...]
) -> None:
    for module in needs:
        pytest.importorskip(module)
    app_dir = flower_e2e_app_or_skip(name, tmp_path / "flower")

    done = deployment.fedcore("run", str(app_dir), "--stream", timeout=150)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    assert re.search(r"run \d+ finished:completed", done.stderr)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-8000:]
    # Its 3 rounds, both nodes training and evaluating in each, as its legacy server logs.
    for stage in ("fit", "evaluate"):
        answered = re.findall(
            rf"aggregate_{stage}: received (\d+) results and (\d+) failures", done.stdout
        )
        assert answered == [("2", "0")] * 3, done.stdout[-8000:]
