"""The LinkState conformance suite for a run's record: when it finished, metrics, artifacts.

The contract of :class:`~fedcore.state.base.RecordState`, beside
:mod:`fedcore.testing.linkstate` and :mod:`fedcore.testing.runstate`; a LinkState
must pass all three. Subclass :class:`RunRecordConformance` and provide the same
``state`` fixture (a new, entered LinkState on the ``fake_clock`` fixture with
heartbeat patience :data:`~fedcore.testing.linkstate.PATIENCE`).

What it checks: a run is stamped ``finished_at`` when it finishes, by whoever moves
it (an operator, its ServerApp, a timer); metrics lines are JSON objects numbered
from 1, paged, announced, kept per run, outliving the run, and a named append sent
again appends nothing; artifacts are kept per run and name, replaced whole, copies of
what was put, outliving the run, and a missing one is ``NotFoundError`` — as is an
unknown run, which is ``RunNotFoundError`` everywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.domain import ArrayRecord, RecordDict, RunStatus
from fedcore.domain.run import MODEL_ARTIFACT
from fedcore.errors import NotFoundError, RunNotFoundError
from fedcore.state.base import LinkState
from fedcore.testing.clock import FakeClock
from fedcore.testing.linkstate import (
    EPSILON,
    PATIENCE,
    UNKNOWN_RUN_ID,
    Recorder,
    advance,
    rich_records,
)

__all__ = ["RunRecordConformance"]

HEADER = {"run": "1", "seed": 0, "config": {"lr": 0.1}, "started": "2025-01-01T00:00:00+00:00"}


def round_line(server_round: int, **metrics: float) -> dict[str, object]:
    """A round's line, in the form of :func:`fedcore.results.metrics.round_row`."""
    return {
        "round": server_round,
        "num_rounds": 3,
        "replies": 2,
        "failures": 0,
        "failures_by_label": {},
        "elapsed": 0.5,
        "train": {"loss": 1.0 / server_round},
        "evaluate": {},
        "server": dict(metrics),
    }


def model(value: float) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": np.full((2, 3), value, dtype=np.float32)})})


class RunRecordConformance:
    """The tests every LinkState must pass; a subclass provides the ``state`` fixture."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def state(self) -> LinkState:
        raise NotImplementedError(
            "a RunRecordConformance subclass must provide the `state` fixture: an entered "
            "LinkState on the `fake_clock` fixture with heartbeat patience PATIENCE"
        )

    @pytest.fixture
    async def run_id(self, state: LinkState) -> int:
        return (await state.create_run({})).run_id

    # When a run finished ------------------------------------------------------------

    async def test_a_run_is_stamped_when_it_finishes_and_not_before(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        assert (await state.get_run(run_id)).finished_at is None
        (claim,) = await state.claim_runs(limit=1, lease=10.0)
        await state.start_run(run_id, claim.token, heartbeat_interval=1.0)
        assert (await state.get_run(run_id)).finished_at is None
        await advance(fake_clock, 0.5)
        finished = await state.update_run_status(run_id, RunStatus.COMPLETED)
        assert finished.finished_at == fake_clock.now()
        (listed,) = [run for run in await state.list_runs() if run.run_id == run_id]
        assert listed.finished_at == fake_clock.now()

    async def test_a_run_failed_by_a_timer_is_stamped_when_the_state_found_it(
        self, state: LinkState, fake_clock: FakeClock, run_id: int
    ) -> None:
        (claim,) = await state.claim_runs(limit=1, lease=0.5)
        await state.start_run(run_id, claim.token, heartbeat_interval=1.0)
        silent_from = fake_clock.now()
        await advance(fake_clock, PATIENCE * 1.0 + EPSILON)
        run = await state.get_run(run_id)
        assert run.status is RunStatus.FAILED
        assert run.finished_at is not None
        assert silent_from + PATIENCE <= run.finished_at <= fake_clock.now()

    # Metrics -----------------------------------------------------------------------

    async def test_metrics_lines_are_numbered_from_one_and_read_back_as_sent(
        self, state: LinkState, run_id: int
    ) -> None:
        assert await state.append_metrics(run_id, [HEADER, round_line(1, accuracy=0.5)]) == 2
        assert await state.append_metrics(run_id, [round_line(2, accuracy=0.75)]) == 3
        assert await state.append_metrics(run_id, []) == 3
        lines = await state.get_metrics(run_id)
        assert [line.seq for line in lines] == [1, 2, 3]
        assert [line.document for line in lines] == [
            HEADER,
            round_line(1, accuracy=0.5),
            round_line(2, accuracy=0.75),
        ]

    async def test_a_metrics_line_is_a_copy_of_what_was_sent(
        self, state: LinkState, run_id: int
    ) -> None:
        sent = round_line(1, accuracy=0.5)
        await state.append_metrics(run_id, [sent])
        sent["server"] = {"accuracy": 0.0}
        (line,) = await state.get_metrics(run_id)
        assert line.document == round_line(1, accuracy=0.5)
        line.document["round"] = 99
        assert (await state.get_metrics(run_id))[0].document["round"] == 1

    async def test_a_diverged_loss_survives_as_nan(self, state: LinkState, run_id: int) -> None:
        await state.append_metrics(run_id, [round_line(1, loss=math.nan, gain=math.inf)])
        (line,) = await state.get_metrics(run_id)
        assert math.isnan(line.document["server"]["loss"])
        assert line.document["server"]["gain"] == math.inf

    async def test_get_metrics_pages_with_after_and_limit(
        self, state: LinkState, run_id: int
    ) -> None:
        await state.append_metrics(run_id, [round_line(n) for n in range(1, 11)])
        assert [line.seq for line in await state.get_metrics(run_id, after=7)] == [8, 9, 10]
        paged = await state.get_metrics(run_id, after=2, limit=3)
        assert [line.document["round"] for line in paged] == [3, 4, 5]
        assert await state.get_metrics(run_id, after=10) == []
        assert await state.get_metrics(run_id, limit=0) == []
        with pytest.raises(ValueError):  # noqa: PT011 - the message is the implementation's
            await state.get_metrics(run_id, limit=-1)

    async def test_metrics_are_kept_per_run_and_outlive_it(
        self, state: LinkState, run_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        await state.append_metrics(run_id, [round_line(1)])
        assert await state.append_metrics(other_run, [HEADER, round_line(1), round_line(2)]) == 3
        await state.update_run_status(run_id, RunStatus.STOPPED)
        assert await state.append_metrics(run_id, [round_line(2)]) == 2  # last words
        assert [line.document["round"] for line in await state.get_metrics(run_id)] == [1, 2]
        assert await state.get_metrics((await state.create_run({})).run_id) == []

    async def test_a_named_append_of_metrics_sent_again_appends_nothing(
        self, state: LinkState, run_id: int
    ) -> None:
        assert await state.append_metrics(run_id, [HEADER], batch="app-1") == 1
        assert await state.append_metrics(run_id, [HEADER], batch="app-1") == 1  # a retry
        assert await state.append_metrics(run_id, [round_line(1)], batch="app-2") == 2
        assert await state.append_metrics(run_id, [round_line(1)], batch="app-2") == 2
        assert await state.append_metrics(run_id, [round_line(2)]) == 3  # unnamed: appended
        assert await state.append_metrics(run_id, [round_line(3)], batch="app-1") == 4
        # The names of log batches are another sequence: one does not stop the other.
        assert await state.append_logs(run_id, ["a line"], batch="app-4") == 1
        assert await state.append_metrics(run_id, [round_line(4)], batch="app-4") == 5

    async def test_a_line_that_is_not_a_json_object_is_refused_with_its_batch(
        self, state: LinkState, run_id: int
    ) -> None:
        with pytest.raises((TypeError, ValueError)):
            await state.append_metrics(run_id, [HEADER, ["not", "an", "object"]])  # type: ignore[list-item]
        with pytest.raises((TypeError, ValueError)):
            await state.append_metrics(run_id, [{"round": object()}])
        with pytest.raises(TypeError):
            await state.append_metrics(run_id, HEADER)  # type: ignore[arg-type]
        assert await state.get_metrics(run_id) == []

    async def test_metrics_of_an_unknown_run_are_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.append_metrics(UNKNOWN_RUN_ID, [HEADER])
        with pytest.raises(RunNotFoundError):
            await state.get_metrics(UNKNOWN_RUN_ID)

    async def test_watch_metrics_hears_the_last_number_of_each_append_of_its_run(
        self, state: LinkState, run_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        heard = Recorder[int]()
        with state.watch_metrics(run_id, heard):
            await state.append_metrics(other_run, [HEADER, round_line(1), round_line(2)])
            await state.append_metrics(run_id, [HEADER, round_line(1)])
            await state.append_metrics(run_id, [])
            await state.append_logs(run_id, ["a log line is not a metrics line"])
            await state.append_metrics(run_id, [round_line(2)])
            await heard.wait_for(3)
        await state.append_metrics(run_id, [round_line(3)])
        assert heard.calls == [2, 3]

    # Artifacts ---------------------------------------------------------------------

    async def test_an_artifact_is_kept_per_run_and_name(
        self, state: LinkState, run_id: int
    ) -> None:
        other_run = (await state.create_run({})).run_id
        await state.put_artifact(run_id, MODEL_ARTIFACT, model(1.0))
        await state.put_artifact(run_id, "checkpoint", rich_records())
        await state.put_artifact(other_run, MODEL_ARTIFACT, model(2.0))
        assert await state.get_artifact(run_id, MODEL_ARTIFACT) == model(1.0)
        assert await state.get_artifact(run_id, "checkpoint") == rich_records()
        assert await state.get_artifact(other_run, MODEL_ARTIFACT) == model(2.0)

    async def test_putting_an_artifact_again_replaces_it_whole(
        self, state: LinkState, run_id: int
    ) -> None:
        await state.put_artifact(run_id, MODEL_ARTIFACT, rich_records())
        await state.put_artifact(run_id, MODEL_ARTIFACT, model(3.0))
        assert await state.get_artifact(run_id, MODEL_ARTIFACT) == model(3.0)

    async def test_an_artifact_is_a_copy_and_outlives_its_run(
        self, state: LinkState, run_id: int
    ) -> None:
        put = model(1.0)
        await state.put_artifact(run_id, MODEL_ARTIFACT, put)
        put.array_records["arrays"]["w"] = np.zeros(1, dtype=np.float32)
        await state.update_run_status(run_id, RunStatus.STOPPED)
        assert await state.get_artifact(run_id, MODEL_ARTIFACT) == model(1.0)
        await state.put_artifact(run_id, MODEL_ARTIFACT, model(4.0))  # a finished run takes one
        assert await state.get_artifact(run_id, MODEL_ARTIFACT) == model(4.0)

    async def test_an_artifact_never_put_is_not_found(self, state: LinkState, run_id: int) -> None:
        other_run = (await state.create_run({})).run_id
        await state.put_artifact(other_run, MODEL_ARTIFACT, model(1.0))
        with pytest.raises(NotFoundError) as missing:
            await state.get_artifact(run_id, MODEL_ARTIFACT)
        assert not isinstance(missing.value, RunNotFoundError)
        with pytest.raises(NotFoundError):
            await state.get_artifact(other_run, "checkpoint")

    async def test_artifacts_of_an_unknown_run_are_refused(self, state: LinkState) -> None:
        with pytest.raises(RunNotFoundError):
            await state.put_artifact(UNKNOWN_RUN_ID, MODEL_ARTIFACT, model(1.0))
        with pytest.raises(RunNotFoundError):
            await state.get_artifact(UNKNOWN_RUN_ID, MODEL_ARTIFACT)

    @pytest.mark.parametrize("name", ["", "Model", "../model", "a b", "x" * 65, "-model"])
    async def test_an_artifact_name_must_be_plain(
        self, state: LinkState, run_id: int, name: str
    ) -> None:
        with pytest.raises(ValueError, match="artifact name"):
            await state.put_artifact(run_id, name, model(1.0))
