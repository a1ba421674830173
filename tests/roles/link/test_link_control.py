"""The link's control API over a LinkState: submitting bundles, following logs and metrics,
reading artifacts, stopping runs."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from fedcore.apps.bundle import pack_bundle
from fedcore.domain import ArrayRecord, RecordDict, RunStatus
from fedcore.domain.run import MODEL_ARTIFACT
from fedcore.errors import BundleError, NotFoundError, RunNotFoundError
from fedcore.roles.link.control import LinkControl
from fedcore.state.memory import InMemoryLinkState
from fedcore.testing import FakeClock

pytestmark = pytest.mark.anyio

APP_TOML = """
[tool.fedcore.app]
server = "app:server"
client = "app:client"
"""


@pytest.fixture
async def state(fake_clock: FakeClock) -> AsyncIterator[InMemoryLinkState]:
    async with InMemoryLinkState(fake_clock, seed=0) as state:
        yield state


@pytest.fixture
def control(state: InMemoryLinkState, tmp_path: Path) -> LinkControl:
    return LinkControl(state, tmp_path / "cache", version="test")


def _bundle(tmp_path: Path) -> bytes:
    app = tmp_path / "app"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(APP_TOML)
    (app / "app.py").write_text("server = client = None\n")
    return pack_bundle(app).data


async def test_a_submitted_run_is_pending_with_its_config_and_bundle(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    data = _bundle(tmp_path)
    run = await control.submit_run(data, {"rounds": 3, "seed": 7})
    assert run.status is RunStatus.PENDING
    assert (run.run_config, run.seed) == ({"rounds": 3, "seed": 7}, 7)
    assert await state.get_bundle(run.bundle_hash) == data
    assert (tmp_path / "cache" / run.bundle_hash / "app.py").is_file()
    assert [r.run_id for r in await control.list_runs()] == [run.run_id]


async def test_a_bundle_that_is_not_an_app_is_refused_without_a_run(
    control: LinkControl, tmp_path: Path
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # pack_bundle itself would refuse this one
        archive.writestr("pyproject.toml", "[project]\nname = 'x'\n")
    with pytest.raises(BundleError, match=r"tool\.fedcore\.app") as caught:
        await control.submit_run(buffer.getvalue(), {})
    assert str(tmp_path) not in str(caught.value)
    with pytest.raises(BundleError):
        await control.submit_run(b"not a zip", {})
    assert await control.list_runs() == []


async def test_a_refused_bundle_is_stored_nowhere(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # safe, and unpacks, but is not an app
        archive.writestr("pyproject.toml", "[project]\nname = 'x'\n")
        archive.writestr("big.bin", b"\0" * 100_000)
    for refused in (buffer.getvalue(), b"not a zip"):
        with pytest.raises(BundleError):
            await control.submit_run(refused, {})
        with pytest.raises(NotFoundError):
            await state.get_bundle(hashlib.sha256(refused).hexdigest())
    cache = tmp_path / "cache"
    assert not cache.exists() or list(cache.iterdir()) == []


async def test_stop_finishes_a_run_once(control: LinkControl, tmp_path: Path) -> None:
    run = await control.submit_run(_bundle(tmp_path), {})
    stopped = await control.stop_run(run.run_id)
    assert (stopped.status, stopped.reason) == (RunStatus.STOPPED, "stopped by the operator")
    assert (await control.stop_run(run.run_id)).status is RunStatus.STOPPED
    with pytest.raises(RunNotFoundError):
        await control.stop_run(12345)


async def test_logs_follow_new_lines_and_end_when_the_run_finishes(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    run = await control.submit_run(_bundle(tmp_path), {})
    await state.append_logs(run.run_id, ["one", "two"])
    seen: list[str] = []

    async def follow() -> None:
        async for line in control.logs(run.run_id, after=1, follow=True):
            seen.append(line.text)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(follow)
        await anyio.wait_all_tasks_blocked()
        assert seen == ["two"]
        await state.append_logs(run.run_id, ["three"])
        await anyio.wait_all_tasks_blocked()
        assert seen == ["two", "three"]
        await state.append_logs(run.run_id, ["last words"])
        await state.update_run_status(run.run_id, RunStatus.FAILED, "boom")
    assert seen == ["two", "three", "last words"]


async def test_logs_without_follow_end_at_the_last_line(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    run = await control.submit_run(_bundle(tmp_path), {})
    await state.append_logs(run.run_id, [f"line {i}" for i in range(2500)])
    lines = [line async for line in control.logs(run.run_id)]
    assert [line.seq for line in lines] == list(range(1, 2501))
    with pytest.raises(RunNotFoundError):
        [line async for line in control.logs(12345)]


async def test_metrics_follow_new_lines_and_end_when_the_run_finishes(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    run = await control.submit_run(_bundle(tmp_path), {})
    await state.append_metrics(run.run_id, [{"run": 1}, {"round": 1}])
    await state.append_logs(run.run_id, ["a log line is no metrics line"])
    seen: list[dict[str, object]] = []

    async def follow() -> None:
        async for line in control.metrics(run.run_id, after=1, follow=True):
            seen.append(line.document)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(follow)
        await anyio.wait_all_tasks_blocked()
        assert seen == [{"round": 1}]
        await state.append_metrics(run.run_id, [{"round": 2}])
        await anyio.wait_all_tasks_blocked()
        assert seen == [{"round": 1}, {"round": 2}]
        await state.append_metrics(run.run_id, [{"round": 3}])
        await state.update_run_status(run.run_id, RunStatus.STOPPED, "enough")
    assert seen == [{"round": 1}, {"round": 2}, {"round": 3}]
    paged = [line.seq async for line in control.metrics(run.run_id)]
    assert paged == [1, 2, 3, 4]


async def test_an_artifact_is_read_through_and_a_missing_one_is_not_found(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    run = await control.submit_run(_bundle(tmp_path), {})
    model = RecordDict({"arrays": ArrayRecord({"w": np.ones(3, dtype=np.float32)})})
    with pytest.raises(NotFoundError):
        await control.get_artifact(run.run_id, MODEL_ARTIFACT)
    await state.put_artifact(run.run_id, MODEL_ARTIFACT, model)
    assert await control.get_artifact(run.run_id, MODEL_ARTIFACT) == model
    with pytest.raises(RunNotFoundError):
        await control.get_artifact(12345, MODEL_ARTIFACT)


async def test_health_and_nodes_count_what_is_live(
    control: LinkControl, state: InMemoryLinkState, tmp_path: Path
) -> None:
    await state.create_nodes(2, heartbeat_interval=1.0)
    await control.submit_run(_bundle(tmp_path), {})
    health = await control.health()
    assert (health.version, health.runs_active, health.nodes_online) == ("test", 1, 2)
    assert len(await control.list_nodes()) == 2
