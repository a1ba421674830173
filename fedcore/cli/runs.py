"""``fedcore run / ls / log / stop``: submit and follow runs on a link's control API.

Each command talks to the link at ``--link HOST:PORT`` (the control address,
default 127.0.0.1:9093, or ``$FEDCORE_LINK``) and prints for a person, or with
``--json`` one JSON document (``log``: one JSON object per line) for a program. It
presents the link's bearer token (found as :mod:`fedcore.auth.control_token`
says), over HTTPS when given ``--root-certificates``; plaintext to a link on another
machine takes ``--insecure``, as it does for ``fedcore serve``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import click

from fedcore.auth.control_token import FIX, TOKEN_ENV, ClientToken, client_token
from fedcore.cli.results_dir import results_dir_options
from fedcore.domain.lifecycle import RunStatus
from fedcore.errors import AppLoadError, AuthenticationError, WrongServiceError
from fedcore.runtime.addresses import Address, parse_address

if TYPE_CHECKING:
    import ssl

    from fedcore.domain.run import LogLine, Run
    from fedcore.results.deployed import DeployedRecorder
    from fedcore.transport.control import ControlService

T = TypeVar("T")

LINK_ENV = "FEDCORE_LINK"
EXIT_CODES = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3}
"""``fedcore run --stream``'s exit status for each way a run ends."""

link_option = click.option(
    "--link",
    "link",
    default=lambda: os.environ.get(LINK_ENV, "127.0.0.1:9093"),
    show_default="127.0.0.1:9093, or $FEDCORE_LINK",
    help="The link's control API address, HOST:PORT.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
_CONNECTION_OPTIONS = (
    link_option,
    click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help=f"The file holding the link's control token (the link's <work dir>/control.token "
        f"or its --control-token-file). Default: ${TOKEN_ENV}, else, for a link on loopback, "
        ".fedcore-link/control.token here (a link started here with the default work dir).",
    ),
    click.option(
        "--root-certificates",
        type=click.Path(dir_okay=False, path_type=Path),
        help="CA certificates to verify the link's control API with: talk HTTPS (the link's "
        "--control-ssl-certfile).",
    ),
    click.option(
        "--insecure",
        is_flag=True,
        help="Talk plaintext to a link on another machine (its token crosses the network "
        "in the clear).",
    ),
)


@dataclass(frozen=True)
class Connection:
    """Where a command finds the link's control API, and how it talks to it."""

    link: str
    token_file: Path | None
    root_certificates: Path | None
    insecure: bool


def connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the options of :data:`_CONNECTION_OPTIONS`, as one ``connection``."""

    @functools.wraps(command)
    def with_connection(
        *args: Any,
        link: str,
        token_file: Path | None,
        root_certificates: Path | None,
        insecure: bool,
        **kwargs: Any,
    ) -> None:
        command(
            *args, connection=Connection(link, token_file, root_certificates, insecure), **kwargs
        )

    decorated = with_connection
    for option in reversed(_CONNECTION_OPTIONS):
        decorated = option(decorated)
    return decorated


def _tls(address: Address, connection: Connection) -> ssl.SSLContext | None:
    """HTTPS trusting ``--root-certificates``; plaintext only on loopback or ``--insecure``."""
    if connection.root_certificates is not None:
        from fedcore.runtime.tls import client_context

        return client_context(connection.root_certificates)
    if not connection.insecure and not address.is_loopback:
        raise click.UsageError(
            f"the link at {address} is on another machine: give --root-certificates (the "
            "control API over TLS), or --insecure to send its token in plaintext"
        )
    return None


@asynccontextmanager
async def _control(
    address: Address, tls: ssl.SSLContext | None, token: ClientToken
) -> AsyncIterator[ControlService]:
    # Imported here, not at the top: aiohttp is most of this module's import time, and
    # `--help` has no use for it.
    from fedcore.transport.http.control import HttpControlClient

    async with HttpControlClient(address.host, address.port, ssl=tls, token=token.token) as client:
        yield client


def call_control(connection: Connection, work: Callable[[ControlService], Awaitable[T]]) -> T:
    """``work`` done with the control API of the link ``connection`` names, in one line
    of error for a person when the link refuses it."""
    address = parse_address(connection.link, what="--link")
    tls = _tls(address, connection)
    token = client_token(connection.token_file, link=address)

    async def main() -> T:
        async with _control(address, tls, token) as control:
            return await work(control)

    try:
        return anyio.run(main)
    except WrongServiceError as exc:  # the likeliest slip: another of the link's ports
        raise WrongServiceError(
            f"{exc}; the link's control API is on --control-address, default 127.0.0.1:9093"
        ) from None
    except AuthenticationError as exc:
        raise AuthenticationError(f"{exc}; {token.hint}") from None


def run_json(run: Run) -> dict[str, Any]:
    """A run as ``--json`` prints it (the id as a string: 63-bit ids exceed JSON's doubles)."""
    return {
        "run_id": str(run.run_id),
        "status": str(run.status),
        "reason": run.reason,
        "created_at": run.created_at,
        "bundle_hash": run.bundle_hash,
        "run_config": run.run_config,
    }


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
        from fedcore.cli.record import follow_run

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
    _tls(address, connection)  # refuses plaintext to another machine, as every command does
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
