"""``fedcore pull``, and the record ``fedcore run --stream`` keeps: a deployed run's results.

Both write the results directory ``fedcore simulate`` leaves
(:class:`~fedcore.results.deployed.DeployedRecorder`) from the run's record on the
link: its log, its metrics lines, its final model. ``run --stream`` writes each line
as it arrives, following the log and the metrics side by side until the run has
finished (the ServerApp sends its last metrics line before it finishes the run, so
following them to the end misses none); ``pull`` reads what the link holds now.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.to_thread
import click

from fedcore.backoff import Backoff, BackoffPolicy
from fedcore.cli.control import Connection, call_control, connection_options, json_option, run_json
from fedcore.clock import SystemClock
from fedcore.errors import LinkUnavailableError, NotFoundError, RunNotFoundError

if TYPE_CHECKING:
    from fedcore.domain import LogLine, RecordDict, Run
    from fedcore.results.deployed import DeployedRecorder
    from fedcore.runtime.control_client import ControlService

T = TypeVar("T")


async def follow_run(
    control: ControlService,
    run_id: int,
    recorder: DeployedRecorder | None,
    echo: Callable[[LogLine], None],
) -> Run:
    """Follow the run's log (each line to ``echo``) and metrics to its end, keeping both
    in ``recorder``, if any; then its model. The run as it ended.

    A link that goes away meanwhile (a restart) is waited for: the streams go on from
    the last line each got, so nothing is shown or kept twice.
    """
    link = _Reconnecting()
    seen = {"logs": 0, "metrics": 0}

    async def logs() -> None:
        async for line in control.logs(run_id, after=seen["logs"], follow=True):
            echo(line)
            if recorder is not None:
                recorder.add_log(line)
            seen["logs"] = line.seq

    async def metrics() -> None:
        assert recorder is not None
        async for line in control.metrics(run_id, after=seen["metrics"], follow=True):
            recorder.add_metrics(line)
            seen["metrics"] = line.seq

    while True:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(link.call, logs)
            if recorder is not None:
                tasks.start_soon(link.call, metrics)
        # A stream ends when its run has finished, or when the link went away quietly.
        final = await link.call(lambda: control.get_run(run_id))
        if final.status.finished:
            break
        await link.pause()
    if recorder is not None:
        await link.call(lambda: finish_record(control, recorder, final))
    return final


FOLLOW_BACKOFF = BackoffPolicy(initial=0.5, maximum=5.0)
"""How often a follower looks for a link that went away: a person waits on it."""


class _Reconnecting:
    """Calls to a link that may go away and come back: a call that cannot reach it is
    made again, with backoff, until it can; the user is told once per absence."""

    def __init__(self) -> None:
        self._backoff = Backoff(SystemClock(), FOLLOW_BACKOFF, random.Random())
        self._away = False

    async def pause(self) -> None:
        """Wait a while before following again: a stream ended, its run has not."""
        await self._backoff.wait()

    async def call(self, work: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                result = await work()
            except LinkUnavailableError as exc:
                if not self._away:
                    self._away = True
                    click.echo(
                        f"{exc}; following again once it is back "
                        "(Ctrl-C stops following: the run goes on on the link)",
                        err=True,
                    )
                await self._backoff.wait()
                continue
            if self._away:
                self._away = False
                self._backoff.reset()
                click.echo("the link is back: following the run again", err=True)
            return result


async def finish_record(control: ControlService, recorder: DeployedRecorder, run: Run) -> None:
    """Close ``recorder`` with ``run`` and its model, and draw its summary picture."""
    from fedcore.results.plot import draw_summary

    model = await _model(control, run.run_id)
    await anyio.to_thread.run_sync(recorder.finish, run, model)
    await anyio.to_thread.run_sync(draw_summary, recorder.path)


async def _model(control: ControlService, run_id: int) -> RecordDict | None:
    from fedcore.domain.run import MODEL_ARTIFACT

    try:
        return await control.get_artifact(run_id, MODEL_ARTIFACT)
    except RunNotFoundError:
        raise
    except NotFoundError:  # main returned no model
        return None


@click.command("pull")
@click.argument("run_id", type=int)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@connection_options
@json_option
def pull(run_id: int, directory: Path, connection: Connection, as_json: bool) -> None:
    """Write a run's record on the link into DIRECTORY, as a results directory.

    The files fedcore simulate leaves: run.json, metrics.jsonl, log.txt, model.npz
    (when main returned a model) and summary.png (with matplotlib), which fedcore plot
    draws. DIRECTORY is made if need be, and must be empty. A run still going gives
    what it has so far (run.json says "running"): pull it again, into another
    directory, once it has finished.
    """
    from fedcore.results.deployed import DeployedRecorder, open_directory

    async def write(control: ControlService) -> tuple[Run, DeployedRecorder]:
        # The status first: a run finished by then has all its lines in what follows.
        run = await control.get_run(run_id)
        recorder = DeployedRecorder(open_directory(directory), run)
        try:
            async for line in control.logs(run_id):
                recorder.add_log(line)
            async for metrics_line in control.metrics(run_id):
                recorder.add_metrics(metrics_line)
            await finish_record(control, recorder, run)
        finally:
            recorder.close()
        return run, recorder

    run, recorder = call_control(connection, write)
    model = recorder.path / "model.npz"
    if as_json:
        document = {**run_json(run), "directory": str(recorder.path), "rounds": recorder.rounds}
        click.echo(json.dumps(document | {"model": model.exists()}))
        return
    kept = ", model.npz" if model.exists() else ", no model"
    click.echo(f"run {run_id} ({run.status}): {recorder.rounds} rounds{kept}, in {recorder.path}")
