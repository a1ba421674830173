"""The exec's composition root, for an exec in a process of its own; and the shared secret.

``fedcore serve --role exec`` comes here. :func:`serve_exec` reads the secret it
shares with the link, makes first contact with the link's exec API (waiting while
the link is not up yet; a wrong secret ends it at once), runs the ServerApp
launcher over :class:`~fedcore.transport.http.exec.HttpExecClient`, writes the ready
file and serves until cancelled. Leaving ends the ServerApp processes it started.

:func:`exec_secret` is the secret file both sides read (the link with
``--exec-address``, the exec): created on first use with a random secret, readable
by its owner only (mode 0600). The secret goes in a file, never on a command line,
where any local user could read it, and never into a log.
"""

from __future__ import annotations

import logging
import os
import secrets
import ssl as _ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from fedcore.clock import Clock, SystemClock
from fedcore.errors import LinkUnavailableError, UsageError
from fedcore.roles.exec.launcher import RETRY_MAX, LaunchSettings, ServerAppLauncher
from fedcore.runtime.addresses import Address
from fedcore.runtime.ready import write_ready_file
from fedcore.transport.http.exec import HttpExecClient

log = logging.getLogger(__name__)

MIN_SECRET_LENGTH = 32
"""Characters a shared secret has at least (a generated one has 43: 256 random bits)."""


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


def exec_secret(path: Path) -> str:
    """The secret in ``path``; a new random one written there (mode 0600) if there is none.

    A link and an exec started at once on the same missing file agree on one secret:
    the file appears complete or not at all (written aside, then linked into place
    unless it exists by then). A secret shorter than :data:`MIN_SECRET_LENGTH` is
    refused with a ``UsageError``.
    """
    if not path.exists():
        _create_secret(path)
    try:
        text = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the exec secret file {path}: {exc}") from None
    if len(text) < MIN_SECRET_LENGTH:
        raise UsageError(
            f"the exec secret in {path} is too short: at least {MIN_SECRET_LENGTH} characters "
            "(delete the file to have a random one made)"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the exec secret file %s is readable by others: chmod 600 it", path)
    return text


def _create_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    handle = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(aside, path)
        except FileExistsError:
            return  # made by someone else meanwhile: theirs is the secret
        log.info("a new exec secret was written to %s", path)
    finally:
        aside.unlink(missing_ok=True)


async def serve_exec(
    options: ExecOptions,
    clock: Clock | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Launch the ServerApps of the link's runs until cancelled."""
    clock = clock or SystemClock()
    secret = exec_secret(options.secret_file)
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


async def _first_contact(client: HttpExecClient, clock: Clock, options: ExecOptions) -> str:
    """The link's runtime address, once the link answered; waits while it is not up yet.

    A refusal (a wrong secret) raises at once: retrying would not change it.
    """
    pause = 0.5
    while True:
        try:
            return await client.runtime_address()
        except LinkUnavailableError:
            log.info("waiting for the link's exec API at %s", options.link)
        except UsageError as exc:
            raise UsageError(
                f"{exc} (is {options.secret_file} the file the link was given as "
                "--exec-secret-file?)"
            ) from None
        await clock.sleep(pause)
        pause = min(2 * pause, RETRY_MAX)
