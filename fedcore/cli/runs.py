"""``fedcore run / ls / log / stop``: submit and follow runs on a link's control API.

Each command talks to the link at ``--link HOST:PORT`` (the control address,
default 127.0.0.1:9093, or ``$FEDCORE_LINK``; see :mod:`fedcore.cli.control`) and
prints for a person, or with ``--json`` one JSON document (``log``: one JSON object
per line) for a program.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fedcore.auth.control_token import FIX, client_token
from fedcore.cli.control import (
    Connection,
    call_control,
    connection_options,
    control_tls,
    json_option,
    run_json,
)
from fedcore.cli.record import follow_run
from fedcore.cli.results_dir import results_dir_options
from fedcore.domain.lifecycle import RunStatus
from fedcore.errors import AppLoadError
from fedcore.runtime.addresses import parse_address

if TYPE_CHECKING:
    from fedcore.domain.run import LogLine, Run
    from fedcore.results.deployed import DeployedRecorder
    from fedcore.runtime.control_client import ControlService

EXIT_CODES = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3}
"""``fedcore run --stream``'s exit status for each way a run ends."""


@click.command("run")
@click.argument(
    "app_dir", default=".", type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@connection_options
@click.option("--run-config", default="", help='Overrides of declared keys: "k=v k2=v2".')
@click.option(
    "--stream",
    is_flag=True,
    help=(
        "Follow the ServerApp's log to the end, keeping the run's results directory "
        "(see --out); exit 0 completed, 1 failed, 3 stopped. Ctrl-C stops following "
        "(exit 130), not the run."
    ),
)
@results_dir_options("With --stream: ", named_by="<seed, else run id>")
@json_option
@click.pass_context
def run(
    ctx: click.Context,
    app_dir: Path,
    connection: Connection,
    run_config: str,
    stream: bool,
    out: Path,
    no_save: bool,
    as_json: bool,
) -> None:
    """Pack APP_DIR (default: here), submit it to the link as a new run, print its id."""
    # Imported here: packing and config resolution load the app machinery (and numpy).
    from fedcore.apps.bundle import pack_bundle
    from fedcore.apps.project import read_project
    from fedcore.apps.run_config import resolve_run_config

    if not stream:
        for given in ("out", "no_save"):
            if ctx.get_parameter_source(given) is click.core.ParameterSource.COMMANDLINE:
                flag = "--" + given.replace("_", "-")
                raise click.UsageError(
                    f"{flag} is for --stream: a run's record is kept as it is followed"
                )
    try:
        project = read_project(app_dir)
    except AppLoadError as exc:
        raise click.UsageError(str(exc)) from None
    config = resolve_run_config(project.config, run_config or None)
    bundle = pack_bundle(app_dir)
    submitted_id: int | None = None
    recorded: Path | None = None

    async def submit(control: ControlService) -> int:
        nonlocal submitted_id, recorded
        submitted = await control.submit_run(bundle.data, config)
        submitted_id = submitted.run_id
        if as_json and not stream:
            click.echo(json.dumps(run_json(submitted)))
        else:
            click.echo(submitted.run_id if not stream else f"run {submitted.run_id} submitted")
        if not stream:
            return 0
        recorder = None if no_save else recorder_for(out, project.name, submitted)
        recorded = None if recorder is None else recorder.path
        final = await follow_run(
            control, submitted.run_id, recorder, lambda line: _echo_line(line, as_json)
        )
        _echo_end(final, as_json)
        if recorded is not None:
            picture = recorded / "summary.png"
            shown = f" (picture: {picture})" if picture.exists() else ""
            click.echo(f"results: {recorded}{shown}", err=True)
        return EXIT_CODES.get(final.status, 1)

    try:
        code = call_control(connection, submit)
    except KeyboardInterrupt:
        if submitted_id is None:
            raise
        # Only this command stops: the run lives on the link, whoever follows it.
        if recorded is not None:
            click.echo(
                f"\nthe run's results so far are in {recorded}; its whole record, once it "
                f"has finished: fedcore pull {submitted_id} DIR --link {connection.link}",
                err=True,
            )
        click.echo(
            f"\ninterrupted: run {submitted_id} goes on on the link; "
            f"stop it with: fedcore stop {submitted_id} --link {connection.link}",
            err=True,
        )
        sys.exit(130)
    sys.exit(code)


def recorder_for(parent: Path, app: str, submitted: Run) -> DeployedRecorder:
    """A recorder of the run ``submitted`` in a new results directory under ``parent``."""
    from fedcore.results.deployed import DeployedRecorder, directory_tag
    from fedcore.results.directory import new_run_directory

    tag = directory_tag(submitted)
    path = new_run_directory(parent, app, tag, time.time())
    return DeployedRecorder(path, submitted)


@click.command("ls")
@connection_options
@click.option("--nodes", is_flag=True, help="List the online nodes instead of the runs.")
@json_option
def ls(connection: Connection, nodes: bool, as_json: bool) -> None:
    """List the link's runs (newest last), or its online nodes."""
    if nodes:
        found = call_control(connection, lambda control: control.list_nodes())
        if as_json:
            click.echo(json.dumps([{"node_id": str(n.node_id), "online": n.online} for n in found]))
        else:
            for node in found:
                click.echo(node.node_id)
        return
    runs = call_control(connection, lambda control: control.list_runs())
    if as_json:
        click.echo(json.dumps([run_json(r) for r in runs]))
        return
    click.echo(f"{'RUN ID':<20}  {'STATUS':<18}  REASON")
    for r in runs:
        click.echo(f"{r.run_id:<20}  {r.status:<18}  {r.reason}")


@click.command("log")
@click.argument("run_id", type=int)
@connection_options
@click.option("--follow", "-f", is_flag=True, help="Wait for new lines until the run finishes.")
@json_option
def log(run_id: int, connection: Connection, follow: bool, as_json: bool) -> None:
    """Print a run's ServerApp log."""

    async def show(control: ControlService) -> None:
        async for line in control.logs(run_id, follow=follow):
            _echo_line(line, as_json)
        if follow:
            _echo_end(await control.get_run(run_id), as_json)

    call_control(connection, show)


@click.command("stop")
@click.argument("run_id", type=int)
@connection_options
@json_option
def stop(run_id: int, connection: Connection, as_json: bool) -> None:
    """Stop a run: its ServerApp is ended and its messages are no longer delivered."""
    stopped = call_control(connection, lambda control: control.stop_run(run_id))
    click.echo(json.dumps(run_json(stopped)) if as_json else f"run {run_id}: {stopped.status}")


@click.command("ui")
@connection_options
def ui(connection: Connection) -> None:
    """Print the address of the link's page, its control token in the fragment.

    The page, served by the link's control API at /ui, lists the link's runs with their
    status and progress, charts the metrics of one as its rounds finish, and lists
    the online nodes. The browser never sends what follows '#' to the link; the page
    keeps the token in its tab and drops it from the address. Whoever has the address
    has the link, as with the token itself: open it, do not paste it into a chat.
    Without a token found here, the page asks for one.
    """
    from urllib.parse import quote

    address = parse_address(connection.link, what="--link")
    control_tls(address, connection)  # refuses plaintext to another machine, as every command does
    scheme = "https" if connection.root_certificates is not None else "http"
    token = client_token(connection.token_file, link=address)
    if token.token is None:
        click.echo(f"no control token found ({FIX}): the page will ask for it", err=True)
        click.echo(f"{scheme}://{address}/ui")
        return
    click.echo(f"{scheme}://{address}/ui#token={quote(token.token, safe='')}")


def _echo_line(line: LogLine, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"seq": line.seq, "time": line.time, "text": line.text}))
    else:
        click.echo(line.text)


def _echo_end(final: Run, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(run_json(final)))
    else:
        reason = f": {final.reason}" if final.reason else ""
        click.echo(f"run {final.run_id} {final.status}{reason}", err=True)
