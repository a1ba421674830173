"""Runs on the node: one bundle fetch, apps that fail to load, Contexts, concurrency, idling."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import anyio
import pytest
from node_helpers import (
    NODE_CONFIG,
    FlakyFleet,
    InlineRunner,
    Runners,
    add_run,
    advance,
    make_bundle,
    node,
    stored,
    train,
    until,
)

from fedcore.apps.bundle import pack_bundle
from fedcore.apps.client_app import ClientApp
from fedcore.apps.loading import load_object
from fedcore.domain import (
    ConfigRecord,
    Context,
    ErrorCode,
    Message,
    MetricRecord,
    RecordDict,
    Run,
    RunStatus,
)
from fedcore.testing import FakeClock
from fedcore.testing.fleet import FakeFleet

pytestmark = pytest.mark.anyio


def counting() -> ClientApp:
    """Counts the messages of its run in ``context.state``, and says what its Context holds."""
    client = ClientApp()

    @client.train()
    async def count(msg: Message, context: Context) -> Message:
        seen = context.state.get("seen")
        n = (seen["n"] if isinstance(seen, ConfigRecord) else 0) + 1
        context.state["seen"] = ConfigRecord({"n": n})
        metrics = {
            "n": n,
            "run": context.run_id,
            "node": context.node_id,
            "partition": context.node_config["partition-id"],
            "rounds": context.run_config.get("num-server-rounds", 0),
        }
        return Message(RecordDict({"m": MetricRecord(metrics)}), reply_to=msg)

    return client


def counts(fake: FakeFleet, message_ids: list[str]) -> list[int]:
    return [reply.content["m"]["n"] for reply in stored(fake, message_ids)]


async def test_a_runs_bundle_is_fetched_once_even_for_concurrent_messages(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path, "app")
    add_run(fake, 1, bundle, **{"num-server-rounds": 3})
    runners = Runners({"app:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners, max_concurrent=3) as serving:
        node_id = await serving.wait_registered()
        sent = [fake.send(1, train(node_id)) for _ in range(3)]
        await until(lambda: all(message_id in fake.replies for message_id in sent))
    assert fleet.pull_limits[0] == 3
    assert fleet.calls["get_run"] == 1
    assert fleet.calls["get_bundle"] == 1
    assert [(run_id, ref) for run_id, _, ref in runners.started] == [(1, "app:client")]
    # One message of a run at a time, so each sees the state the one before left.
    assert sorted(counts(fake, sent)) == [1, 2, 3]
    app_dir = runners.started[0][1]
    assert app_dir == tmp_path / "cache" / bundle.sha256
    assert (app_dir / "pyproject.toml").is_file()


async def test_context_state_persists_across_a_runs_messages_and_is_separate_per_run(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "a", "a:client"), **{"num-server-rounds": 3})
    add_run(fake, 2, make_bundle(tmp_path, "b", "b:client"), **{"num-server-rounds": 7})
    runners = Runners({"a:client": counting(), "b:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        order = [1, 2, 1, 2, 1]
        sent = []
        for run_id in order:
            sent.append(fake.send(run_id, train(node_id)))
            await until(lambda: sent[-1] in fake.replies)
    assert counts(fake, sent) == [1, 1, 2, 2, 3]
    metrics = [reply.content["m"] for reply in stored(fake, sent)]
    assert [m["run"] for m in metrics] == order
    assert [m["rounds"] for m in metrics] == [3, 7, 3, 7, 3]
    assert all(m["node"] == node_id for m in metrics)
    assert all(m["partition"] == NODE_CONFIG["partition-id"] for m in metrics)
    assert fleet.calls["get_bundle"] == 2
    assert sorted(run_id for run_id, _, _ in runners.started) == [1, 2]


async def test_runs_of_the_same_bundle_share_one_download(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path, "app")
    add_run(fake, 1, bundle)
    add_run(fake, 2, bundle)
    runners = Runners({"app:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        sent = [fake.send(run_id, train(node_id)) for run_id in (1, 2)]
        await until(lambda: all(message_id in fake.replies for message_id in sent))
    assert fleet.calls["get_bundle"] == 1
    assert [path for _, path, _ in runners.started] == [tmp_path / "cache" / bundle.sha256] * 2
    assert counts(fake, sent) == [1, 1]


async def test_a_bundle_altered_on_its_way_gets_code_1_replies_and_other_runs_go_on(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "bad"))
    add_run(fake, 2, make_bundle(tmp_path, "good"))
    runners = Runners({"app:client": counting()})
    fleet.tamper_bundle = True
    async with node(fleet, fake_clock, tmp_path / "cache", runners, max_concurrent=2) as serving:
        node_id = await serving.wait_registered()
        failing = [fake.send(1, train(node_id)) for _ in range(2)]
        await until(lambda: all(message_id in fake.replies for message_id in failing))
        fleet.tamper_bundle = False
        failing.append(fake.send(1, train(node_id)))
        fine = fake.send(2, train(node_id))
        await until(lambda: failing[-1] in fake.replies and fine in fake.replies)
    for reply in stored(fake, failing):
        assert reply.error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION
        assert "bundle hash mismatch" in reply.error.reason
        assert "\n" not in reply.error.reason
    assert fleet.calls["get_bundle"] == 2  # run 1's failure is remembered, not fetched again
    assert counts(fake, [fine]) == [1]
    assert [run_id for run_id, _, _ in runners.started] == [2]
    assert not any((tmp_path / "cache").glob(".*"))  # nothing half-unpacked is left
    assert caplog.text.count("run 1: its app cannot be loaded") == 1


async def test_a_bundle_announced_with_another_digest_is_refused(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    real_get_run = fleet.get_run

    async def lying_get_run(node_id: int, run_id: int) -> tuple[Run, object]:
        run, digest = await real_get_run(node_id, run_id)
        other = pack_bundle(tmp_path / "app").data + b"x"
        return run, type(digest).of(other)

    fleet.get_run = lying_get_run  # type: ignore[method-assign,assignment]
    async with node(fleet, fake_clock, tmp_path / "cache", Runners({})) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, train(node_id))
        await until(lambda: message_id in fake.replies)
    error = fake.replies[message_id].reply.error
    assert error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION
    assert "bundle hash mismatch" in error.reason


@pytest.mark.parametrize(
    ("client_ref", "reason"),
    [("missing:client", "cannot load ClientApp 'missing:client'"), ("nocolon", "module:attr")],
)
async def test_an_app_that_cannot_load_gets_code_1_replies(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    client_ref: str,
    reason: str,
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app", client_ref))
    async with node(fleet, fake_clock, tmp_path / "cache", Runners({})) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, train(node_id))
        await until(lambda: message_id in fake.replies)
    error = fake.replies[message_id].reply.error
    assert error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION
    assert reason in error.reason


async def test_a_bundle_download_waits_for_the_link_instead_of_failing(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    fleet.down["get_bundle"] = 3
    runners = Runners({"app:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, train(node_id))
        await until(lambda: fleet.calls["get_bundle"] == 1)
        await advance(fake_clock, 10.0, step=0.1)
        await until(lambda: message_id in fake.replies)
    assert fleet.calls["get_bundle"] == 4
    assert counts(fake, [message_id]) == [1]


async def test_the_client_app_is_loaded_from_the_unpacked_bundle(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    module = f"node_app_{uuid.uuid4().hex}"
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text(
        f'[tool.fedcore.app]\nserver = "{module}:server"\nclient = "{module}:client"\n'
    )
    (app_dir / f"{module}.py").write_text(
        "import fedcore as fc\n"
        "client = fc.ClientApp()\n"
        "@client.train()\n"
        "async def train(msg, context):\n"
        "    metrics = fc.MetricRecord({'from-bundle': 1})\n"
        "    return fc.Message(fc.RecordDict({'m': metrics}), reply_to=msg)\n"
    )
    add_run(fake, 1, pack_bundle(app_dir))
    loaded: list[Path] = []

    def from_bundle(run: Run, path: Path, client_ref: str) -> InlineRunner:
        loaded.append(path)
        client = load_object(client_ref, path, ClientApp, "ClientApp")
        return Runners({client_ref: client})(run, path, client_ref)

    async with node(fleet, fake_clock, tmp_path / "cache", from_bundle) as serving:
        node_id = await serving.wait_registered()
        message_id = fake.send(1, train(node_id))
        await until(lambda: message_id in fake.replies)
    assert fake.replies[message_id].reply.content["m"]["from-bundle"] == 1
    assert loaded[0].parent == tmp_path / "cache"
    assert (loaded[0] / f"{module}.py").is_file()


async def test_no_more_messages_run_at_once_than_max_concurrent(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    running: set[str] = set()
    most = 0
    release: dict[str, anyio.Event] = {}
    client = ClientApp()

    @client.train()
    async def hold(msg: Message, context: Context) -> Message:
        nonlocal most
        running.add(msg.metadata.message_id)
        most = max(most, len(running))
        await release.setdefault(msg.metadata.message_id, anyio.Event()).wait()
        running.discard(msg.metadata.message_id)
        return Message(RecordDict({"m": MetricRecord({"n": 1})}), reply_to=msg)

    bundle = make_bundle(tmp_path, "app")
    for run_id in range(1, 6):  # one message per run: runs go side by side
        add_run(fake, run_id, bundle)
    runners = Runners({"app:client": client})
    async with node(fleet, fake_clock, tmp_path / "cache", runners, max_concurrent=2) as serving:
        node_id = await serving.wait_registered()
        sent = [fake.send(run_id, train(node_id)) for run_id in range(1, 6)]
        for left in range(5, 0, -1):
            expected = min(2, left)
            await until(lambda expected=expected: len(running) == expected)
            await advance(fake_clock, 2.0)  # heartbeats go on; nothing else starts
            assert len(running) == expected
            release.setdefault(sorted(running)[0], anyio.Event()).set()
        await until(lambda: all(message_id in fake.replies for message_id in sent))
    assert most == 2
    assert all(0 < limit <= 2 for limit in fleet.pull_limits)


async def test_an_idle_runner_stops_and_its_state_survives_until_the_run_finishes(
    fake: FakeFleet,
    fleet: FlakyFleet,
    fake_clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fedcore.roles.node")
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": counting()})
    options = {"idle_timeout": 10.0}
    async with node(fleet, fake_clock, tmp_path / "cache", runners, **options) as serving:
        node_id = await serving.wait_registered()
        first = fake.send(1, train(node_id))
        await until(lambda: first in fake.replies)
        assert runners.open == 1
        await advance(fake_clock, 15.0, step=0.5)
        await until(lambda: runners.open == 0)
        assert "run 1 has been idle for 10 s" in caplog.text
        second = fake.send(1, train(node_id))
        await until(lambda: second in fake.replies)
        assert counts(fake, [first, second]) == [1, 2]  # the Context outlived the runner
        assert runners.open == 1
        fake.runs[1][0].status = RunStatus.COMPLETED
        await advance(fake_clock, 15.0, step=0.5)
        await until(lambda: runners.open == 0)
        assert "run 1 has finished" in caplog.text
        fake.runs[1][0].status = RunStatus.RUNNING  # (a new run with a reused id)
        third = fake.send(1, train(node_id))
        await until(lambda: third in fake.replies)
    assert counts(fake, [third]) == [1]  # a fresh Context: the finished run's was forgotten
    assert len(runners.started) == 3


async def test_a_runner_that_breaks_answers_code_8_and_is_started_again(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": counting()})
    broken = {"once": True}

    class Breaking(InlineRunner):
        async def run(self, message: Message, context: Context) -> tuple[Message, Context]:
            if broken.pop("once", False):
                raise BrokenPipeError("the ClientApp process went away")
            return await super().run(message, context)

    def factory(run: Run, path: Path, client_ref: str) -> InlineRunner:
        return Breaking(runners, run, path, client_ref)

    async with node(fleet, fake_clock, tmp_path / "cache", factory) as serving:
        node_id = await serving.wait_registered()
        first = fake.send(1, train(node_id))
        await until(lambda: first in fake.replies)
        second = fake.send(1, train(node_id))
        await until(lambda: second in fake.replies)
    error = fake.replies[first].reply.error
    assert error.code == ErrorCode.CLIENT_APP_CRASHED
    assert "BrokenPipeError: the ClientApp process went away" in error.reason
    assert counts(fake, [second]) == [1]
    assert len(runners.started) == 2


async def test_a_finished_runs_runner_stops_within_a_heartbeat_interval(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """Not an idle timeout later: a ClientApp process costs the node its memory till then."""
    bundle = make_bundle(tmp_path, "app")
    add_run(fake, 1, bundle)
    add_run(fake, 2, bundle)
    runners = Runners({"app:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:  # idle: 600 s
        node_id = await serving.wait_registered()
        sent = [fake.send(run_id, train(node_id)) for run_id in (1, 2)]
        await until(lambda: all(message_id in fake.replies for message_id in sent))
        assert runners.open == 2
        fake.runs[1][0].status = RunStatus.STOPPED
        await advance(fake_clock, 1.5, step=0.25)  # heartbeat interval: 1 s
        await until(lambda: runners.open == 1)
        await advance(fake_clock, 5.0, step=0.5)
        assert runners.open == 1  # run 2 goes on: its runner (and Context) stay
        third = fake.send(2, train(node_id))
        await until(lambda: third in fake.replies)
    assert counts(fake, [sent[1], third]) == [1, 2]
    assert len(runners.started) == 2


async def test_a_run_the_link_no_longer_knows_keeps_its_runner_until_it_idles(
    fake: FakeFleet, fleet: FlakyFleet, fake_clock: FakeClock, tmp_path: Path
) -> None:
    """A link restarted since it handed out the run's messages may not know the run; the
    run may still be going on, so its runner and Context stay, unlike a finished run's."""
    add_run(fake, 1, make_bundle(tmp_path, "app"))
    runners = Runners({"app:client": counting()})
    async with node(fleet, fake_clock, tmp_path / "cache", runners) as serving:
        node_id = await serving.wait_registered()
        first = fake.send(1, train(node_id))
        await until(lambda: first in fake.replies)
        known = fake.runs.pop(1)  # the link forgot it
        await advance(fake_clock, 5.0, step=0.5)  # five heartbeat intervals
        assert runners.open == 1
        fake.runs[1] = known  # it comes back, and the run goes on with its Context
        second = fake.send(1, train(node_id))
        await until(lambda: second in fake.replies)
    assert counts(fake, [first, second]) == [1, 2]
    assert len(runners.started) == 1
