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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import click

from fedcore.cli.runs import Connection, call_control, connection_options, json_option, run_json
from fedcore.errors import NotFoundError, RunNotFoundError

if TYPE_CHECKING:
    from fedcore.domain import LogLine, RecordDict, Run
    from fedcore.results.deployed import DeployedRecorder
    from fedcore.transport.control import ControlService


async def follow_run(
    control: ControlService,
    run_id: int,
    recorder: DeployedRecorder | None,
    echo: Callable[[LogLine], None],
) -> Run:
    """Follow the run's log (each line to ``echo``) and metrics to its end, keeping both
    in ``recorder``, if any; then its model. The run as it ended."""

    async def logs() -> None:
        async for line in control.logs(run_id, follow=True):
            echo(line)
            if recorder is not None:
                recorder.add_log(line)

    async def metrics() -> None:
        assert recorder is not None
        async for line in control.metrics(run_id, follow=True):
            recorder.add_metrics(line)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(logs)
        if recorder is not None:
            tasks.start_soon(metrics)
    final = await control.get_run(run_id)
    if recorder is not None:
        await finish_record(control, recorder, final)
    return final


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
