"""The exec's composition roots, for an exec in a process of its own: a link's, or a node's.

``fedcore serve --role exec`` comes here (through :mod:`fedcore.runtime.serve`). For a
link (``--link-exec``), :func:`serve_exec` reads the secret it shares with the link,
makes first contact with the link's exec API (waiting while the link is not up yet; a
wrong secret ends it at once), runs the ServerApp launcher over
:class:`~fedcore.transport.http.exec.HttpExecClient`, writes the ready file and serves
until cancelled. Leaving ends the ServerApp processes it started. For a node
(``--exec-socket``), :func:`serve_node_exec` starts the node's ClientApp processes when
the node asks on a Unix socket (:mod:`fedcore.workers.spawn`).

The secret it shares with the link is in a file both read
(:func:`fedcore.auth.secret_files.read_secret`).
"""

from __future__ import annotations

import logging
import ssl as _ssl
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio
import anyio.abc

from fedcore.auth.secret_files import read_secret
from fedcore.clock import Clock, SystemClock
from fedcore.errors import UsageError
from fedcore.roles.exec.launcher import LaunchSettings, ServerAppLauncher, patiently
from fedcore.runtime.addresses import Address
from fedcore.runtime.ready import write_ready_file
from fedcore.transport.http.exec import HttpExecClient
from fedcore.workers.spawn import serve_spawner, worker_command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecOptions:
    """Everything ``fedcore serve --role exec`` takes.

    ``runtime_address`` is where the ServerApps reach the link's runtime API; None
    takes the address the link gives.
    """

    link: Address
    secret_file: Path
    runtime_address: str | None = None
    work_dir: Path = Path(".fedcore-exec")
    ready_file: Path | None = None
    ssl: _ssl.SSLContext | None = None
    launch: LaunchSettings = field(default_factory=LaunchSettings)


async def serve_exec(
    options: ExecOptions,
    clock: Clock | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Launch the ServerApps of the link's runs until cancelled."""
    clock = clock or SystemClock()
    secret = read_secret(options.secret_file, what="exec secret")
    link = options.link
    async with HttpExecClient(
        link.host, link.port, secret=secret, clock=clock, ssl=options.ssl
    ) as client:
        runtime = await _first_contact(client, clock, options)
        launcher = ServerAppLauncher(
            client,
            clock,
            work_dir=options.work_dir,
            settings=options.launch,
            runtime_address=options.runtime_address,
        )
        async with anyio.create_task_group() as tasks:
            await tasks.start(launcher.serve)
            if options.ready_file is not None:
                write_ready_file(options.ready_file, {})
            log.info(
                "exec ready: launching the runs of the link at %s; their ServerApps reach it at %s",
                link,
                options.runtime_address or runtime,
            )
            task_status.started()


async def serve_node_exec(
    socket_path: Path,
    secret_file: Path,
    ready_file: Path | None = None,
    *,
    app_env: tuple[str, ...] = (),
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Start a node's ClientApp processes, asked for at ``socket_path``, until cancelled.

    They get the variables named in ``app_env`` beside the allowed ones."""
    secret = read_secret(secret_file, what="exec secret")
    async with anyio.create_task_group() as tasks:
        await tasks.start(
            partial(serve_spawner, socket_path, secret, worker_command, app_env=app_env)
        )
        if ready_file is not None:
            write_ready_file(ready_file, {})
        log.info("exec ready: starting ClientApp processes for the node asking at %s", socket_path)
        task_status.started()


async def _first_contact(client: HttpExecClient, clock: Clock, options: ExecOptions) -> str:
    """The link's runtime address, once the link answered; waits while it is not up yet.

    A refusal (a wrong secret) raises at once: retrying would not change it.
    """
    try:
        return await patiently(
            clock,
            client.runtime_address,
            note=lambda exc, delay: log.info("waiting for the link's exec API at %s", options.link),
        )
    except UsageError as exc:
        raise UsageError(
            f"{exc} (is {options.secret_file} the file the link was given as --exec-secret-file?)"
        ) from None
